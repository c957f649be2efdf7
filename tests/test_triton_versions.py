"""The Triton version gate (ula/core/backends.py): a Triton older than the kernels need, or none, is named in the
error of backend='triton' and makes backend='auto' on CUDA take the PyTorch path with a warning (before, 3.2 and 3.3
failed deep in an import, and 'auto' fell back to the much slower path silently)."""
import sys
import warnings

import pytest
import torch

import ula
from ula.core import backends
from ula.core.chunk_torch import chunk_recurrence

triton = pytest.importorskip("triton")


@pytest.fixture
def fresh_gate():
    backends._PROBLEM.clear()
    backends._WARNED.clear()
    yield
    backends._PROBLEM.clear()
    backends._WARNED.clear()
    backends.triton_problem()  # found again, as at import


@pytest.mark.parametrize("text, want", [("3.4.0", (3, 4)), ("3.10.1+git12ab", (3, 10)), ("4.0", (4, 0)),
                                        ("nightly", (0, 0))])
def test_version_parse(text, want):
    assert backends._version(text) == want


def test_installed_triton_judged_by_its_version(fresh_gate):
    """CI's Triton (3.6) passes; under scripts/triton_versions.sh an older one must be refused."""
    supported = backends._version(triton.__version__) >= backends.MIN_TRITON
    assert (backends.triton_problem() is None) == supported


def test_old_triton_refused_by_name(fresh_gate, monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.3.1")
    q = torch.randn(1, 8, 1, 16)
    with pytest.raises(RuntimeError, match=r"Triton 3\.3\.1 is installed.*need Triton >= 3\.4.*backend='torch'"):
        ula.linear_attention(q, q, q, backend="triton")


def test_auto_on_cuda_with_old_triton_warns_once_and_runs_torch(fresh_gate, monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.2.0")
    cuda = torch.device("cuda")
    with pytest.warns(RuntimeWarning, match=r"PyTorch path on CUDA.*Triton 3\.2\.0"):
        assert backends.chunk_fn("auto", cuda) is chunk_recurrence
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert backends.chunk_fn("auto", cuda) is chunk_recurrence


def test_missing_triton_named(fresh_gate, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    with pytest.raises(RuntimeError, match="Triton is not installed"):
        backends.chunk_fn("triton", torch.device("cuda"))
    with pytest.warns(RuntimeWarning, match="Triton is not installed"):
        assert backends.chunk_fn("auto", torch.device("cuda")) is chunk_recurrence


def test_launches_state_fp_fusion():
    """Every launch and dry-run compile asks for FP fusion by name: the kernels were tuned and checked with it on,
    Triton 3.10 turns its default off, and 3.9 warns in every process that leaves it unset."""
    from ula.core.triton import utils
    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(kw)

        def warmup(self, *args, **kw):
            seen.append(kw)

    utils._launch_fitting(Kernel(), (1,), (), 4, {"BLOCK": 16})
    utils._launch_fitting(Kernel(), (1,), (), 4, {"BLOCK": 16}, num_stages=2)
    utils._warmup(Kernel(), (1,), (), 4, {"BLOCK": 16})
    assert len(seen) == 3 and all(kw.get("enable_fp_fusion") is True and kw["BLOCK"] == 16 for kw in seen)


@pytest.mark.parametrize("capability, warns", [((7, 5), True), ((7, 0), True), ((8, 0), False), ((9, 0), False)])
def test_gpu_older_than_ampere_warned_once(monkeypatch, capability, warns):
    """A GPU before compute capability 8.0 runs the kernels (Triton compiles them) but gets a warning, once per
    GPU, that they spill there (benchmarks/results/offline_compile_sm70_triton3.6.0.txt); newer ones get none."""
    monkeypatch.setattr(backends, "_GPUS_SEEN", set())
    monkeypatch.setattr(backends, "_CAPABILITY", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx: "Some GPU")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            backends._check_gpu(torch.device("cuda", 1))
    msgs = [str(w.message) for w in seen]
    if warns:
        assert len(msgs) == 1 and "Some GPU" in msgs[0] and f"{capability[0]}.{capability[1]}" in msgs[0]
        assert "backend='torch'" in msgs[0]
    else:
        assert msgs == []
