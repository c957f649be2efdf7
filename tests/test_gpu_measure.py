"""On a GPU (ULA_TEST_GPU=1): timing an op leaves the caller's gradients as they were. The benchmarks keep a leaf's
gradient as the result to check; `.float()` of a float32 gradient is that tensor itself, and session 31-32's error
columns for the decayed packed ops read 8-18 because measure's first backward added to it."""
import pytest
import torch
import torch.nn.functional as F

from helpers import DEVICE
import ula
from ula.bench.measure import measure

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="ula.bench.measure times CUDA calls (ULA_TEST_GPU=1)")


def test_measure_leaves_callers_gradients():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(1, 256, 2, 32, device=DEVICE, generator=g).requires_grad_() for _ in range(3))
    f = (torch.randn(1, 256, 2, device=DEVICE, generator=g) + 3).requires_grad_()

    def fn(q, k, v, f):
        return ula.linear_attention(q, k, v, F.logsigmoid(f))[0]

    fn(q, k, v, f).sum().backward()
    held = [a.grad for a in (q, k, v, f)]
    kept = [x.clone() for x in held]
    measure(fn, [q, k, v, f])
    for x, y in zip(held, kept):
        assert torch.equal(x, y)


def test_bench_graph_columns(tmp_path):
    """`ula bench` on a GPU (graphs by default): every row gains the medians of CUDA-graph replays (SDPA's too), and
    time_graph.png."""
    from ula.bench.runner import run_bench
    res = run_bench(str(tmp_path), kinds=("none", "vector"), seq_lens=[256], batch=1, heads=2, head_dim=64,
                    peers=True, device="cuda")
    assert res["meta"]["graph"] is True
    ours = [r for r in res["rows"] if r["kernel"].startswith("ula_")]
    assert len(ours) == 2 and any(r["kernel"] == "sdpa_causal" for r in res["rows"])
    for r in res["rows"]:
        if "error" not in r and "graph_error" not in r:
            assert 0 < r["fwd_graph_ms"] < r["fwdbwd_graph_ms"], r
    assert all("fwd_graph_ms" in r for r in ours)
    assert (tmp_path / "time_graph.png").exists()
