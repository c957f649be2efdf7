"""`ula info` (ula/info.py): versions, each GPU and the path backend='auto' takes there, asked of the code that
decides (ula/core/backends.py) with its warnings. GPUs are faked here: CI has none."""
import json
import types

import pytest
import torch

import ula
from ula import cli
from ula.core import backends


def _info(capsys, *extra):
    assert cli.main(["info", *extra]) == 0
    return capsys.readouterr().out


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two GPUs: an H100 (9.0) and a T4 (7.5); the backend's warned-once sets emptied."""
    caps = {0: (9, 0), 1: (7, 5)}
    names = {0: "NVIDIA H100 80GB HBM3", 1: "Tesla T4"}
    idx = lambda d: d.index if isinstance(d, torch.device) else d  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: caps[idx(d)])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names[idx(d)])
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(total_memory=80 * 2 ** 30, multi_processor_count=132))
    monkeypatch.setattr(backends, "_GPUS_SEEN", set())
    monkeypatch.setattr(backends, "_CAPABILITY", {})
    monkeypatch.setattr(backends, "_WARNED", set())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine's own GPUs would be listed")
def test_info_on_this_cpu_machine(capsys, monkeypatch):
    monkeypatch.setenv("ULA_TUNE_STATE", "64,64,64,4")
    out = _info(capsys)
    assert f"ula {ula.__version__}" in out and f"torch {torch.__version__}" in out
    assert "GPUs: none visible" in out and "backend='auto' runs the PyTorch chunk path" in out
    assert "setting ULA_TUNE_STATE=64,64,64,4" in out


def test_info_per_gpu_path_and_warning(capsys, fake_gpus):
    lines = _info(capsys).splitlines()
    h100 = [i for i, x in enumerate(lines) if x.startswith("cuda:0 NVIDIA H100")]
    t4 = [i for i, x in enumerate(lines) if x.startswith("cuda:1 Tesla T4")]
    assert h100 and t4, lines
    assert "compute capability 9.0" in lines[h100[0]] and lines[h100[0]].endswith("runs ula's Triton kernels")
    assert not lines[h100[0] + 1].startswith("  warning")  # the H100 gets none
    assert lines[t4[0]].endswith("runs ula's Triton kernels")
    assert lines[t4[0] + 1].startswith("  warning: ula: Tesla T4 (compute capability 7.5)")


def test_info_without_a_usable_triton(capsys, fake_gpus, monkeypatch):
    monkeypatch.setattr(backends, "triton_problem", lambda: "Triton 3.3.1 is installed and ula's kernels need ...")
    r = json.loads(_info(capsys, "--json"))
    assert [g["auto"] for g in r["gpus"]] == ["the PyTorch chunk path"] * 2
    assert "Triton 3.3.1" in r["gpus"][0]["notes"][0] and r["gpus"][1]["notes"] == []  # warned once per reason
    assert r["triton_problem"].startswith("Triton 3.3.1")
