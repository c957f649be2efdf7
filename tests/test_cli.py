"""Smoke tests of the `ula` command on the CPU with tiny settings: every subcommand writes its files,
the JSON parses, a resumed run reproduces the uninterrupted run's losses bitwise, errors are clear."""
import json
import os

import pytest
import torch

from ula.cli import main
from ula.demo.mqar import IGNORE, mqar_batch
from ula.train.schedule import lr_factor

THREADS = ["--threads", str(torch.get_num_threads())]   # leave the test process's thread count alone
TINY_TRAIN = ["--d-model", "16", "--heads", "2", "--layers", "1", "--seq-len", "16", "--batch-size", "2",
              "--eval-batches", "1", "--warmup", "1", "--device", "cpu"] + THREADS


def _json(path):
    with open(path) as f:
        return json.load(f)


def test_mqar_batch_pairs_and_targets():
    g = torch.Generator().manual_seed(0)
    for T in (None, 40):
        x, y = mqar_batch(4, 5, 32, T, g)
        assert x.shape == y.shape == (4, T or 20)
        for b in range(4):
            pairs = {int(x[b, 2 * i]): int(x[b, 2 * i + 1]) for i in range(5)}
            assert len(pairs) == 5 and all(1 <= k < 16 <= v < 32 for k, v in pairs.items())
            where = (y[b] != IGNORE).nonzero().flatten().tolist()
            assert len(where) == 5 and all(p >= 10 for p in where)
            assert all(pairs[int(x[b, p])] == int(y[b, p]) == int(x[b, p + 1]) for p in where)
    with pytest.raises(ValueError):
        mqar_batch(1, 20, 32)
    for noise in (False, True):      # prefix P: P random tokens, then the same kind of sequence of T - P
        x, y = mqar_batch(4, 5, 32, 46, torch.Generator().manual_seed(1), noise=noise, prefix=6)
        assert x.shape == y.shape == (4, 46) and (y[:, :6] == IGNORE).all() and int((y != IGNORE).sum()) == 20
        for b in range(4):
            pairs = {int(x[b, 6 + 2 * i]): int(x[b, 7 + 2 * i]) for i in range(5)}
            where = (y[b] != IGNORE).nonzero().flatten().tolist()
            assert len(pairs) == 5 and all(p >= 16 for p in where)
            assert all(pairs[int(x[b, p])] == int(y[b, p]) == int(x[b, p + 1]) for p in where)
            if noise:                # random filler after the pairs, never one of this sequence's keys
                qa = set(where) | {p + 1 for p in where}
                assert all(int(x[b, i]) not in pairs for i in range(16, 46) if i not in qa)
    with pytest.raises(ValueError):
        mqar_batch(1, 5, 32, 24, prefix=6)


def test_demo_tiny(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--tiny", "--out", str(out), "--device", "cpu"] + THREADS) == 0
    res = _json(out / "results.json")
    assert [r["mixer"] for r in res["results"]] == ["linear", "gla", "softmax"]
    for r in res["results"]:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["state_numbers"] > 0 and r["runs"][0]["loss_curve"]
    assert (out / "mqar.png").stat().st_size > 1000
    assert "accuracy %" in capsys.readouterr().out


def test_train_resume_is_exact_and_generate(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--steps", "4", "--save-every", "2", "--eval-every", "2", "--out", str(a)] + TINY_TRAIN) == 0
    m = _json(a / "metrics.json")
    assert m["steps_done"] == 4 and m["final_val_bpb"] > 0 and (a / "loss.png").exists()
    assert sorted(os.listdir(a / "checkpoints")) == ["step-000002", "step-000004"]
    assert main(["train", "--resume", str(a / "checkpoints" / "step-000002"), "--out", str(b)] + THREADS) == 0
    full, resumed = m["history"]["train"], _json(b / "metrics.json")["history"]["train"]
    assert [r[0] for r in resumed] == [1, 2, 3, 4]
    assert resumed[2][1] == full[2][1] and resumed[3][1] == full[3][1]     # steps 3 and 4, bitwise
    capsys.readouterr()
    assert main(["generate", str(a), "--prompt", "The ", "--max-new-tokens", "8", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("The ")
    # a finished run resumed: nothing to train, said so; no speed of 0 tokens/s in its metrics
    assert main(["train", "--resume", str(b)] + THREADS) == 0
    assert "no step to train: the run was already at step 4" in capsys.readouterr().out
    assert _json(b / "metrics.json")["tokens_per_second"] is None


def test_train_compile(tmp_path, capsys):
    """--compile BACKEND: the training steps under torch.compile give the eager run's losses (aot_eager: the same
    ops, traced); an unknown backend is an error naming the option and the backends there are."""
    args = ["train", "--steps", "3", "--eval-every", "3", "--mixer", "mlstm_exp"] + TINY_TRAIN
    assert main(args + ["--out", str(tmp_path / "eager")]) == 0
    from torch._dynamo.utils import counters
    counters.clear()
    assert main(args + ["--compile", "aot_eager", "--out", str(tmp_path / "compiled")]) == 0
    assert "compiled (aot_eager)" in capsys.readouterr().out
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters["graph_break"])
    eager, comp = (_json(tmp_path / n / "metrics.json")["history"]["train"] for n in ("eager", "compiled"))
    assert len(eager) == len(comp) == 3
    for (_, le, _), (_, lc, _) in zip(eager, comp):
        assert abs(le - lc) <= 1e-5 * abs(le), (le, lc)
    assert main(args + ["--compile", "no_such_backend", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "--compile" in err and "no_such_backend" in err and "inductor" in err
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world " * 10)
    assert main(args + ["--compile", str(corpus), "--out", str(tmp_path / "bad")]) == 2
    assert "the data argument went to --compile" in capsys.readouterr().err


def test_train_errors(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.txt")] + TINY_TRAIN) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["train", str(tmp_path / "empty")] + TINY_TRAIN) == 2
    assert "is empty" in capsys.readouterr().err
    f = tmp_path / "small.txt"
    f.write_text("hello world " * 10)
    a = tmp_path / "a"
    assert main(["train", str(f), "--steps", "1", "--out", str(a)] + TINY_TRAIN) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(a), "--d-model", "32", "--out", str(tmp_path / "b")] + THREADS) == 2
    assert "another model shape" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "empty")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_missing_gpu_falls_back_to_cpu(tmp_path, capsys):
    args = TINY_TRAIN[:-len(THREADS) - 2] + THREADS
    assert main(["train", "--steps", "1", "--device", "cuda", "--out", str(tmp_path / "c")] + args) == 0
    assert "falling back to the CPU" in capsys.readouterr().out


def test_bench_cpu(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--seq-lens", "32,64", "--kinds", "none,vector", "--reps", "1", "--out", str(out)]
                + THREADS) == 0
    res = _json(out / "results.json")
    kernels = {r["kernel"] for r in res["rows"]}
    assert {"ula_none", "ula_vector", "sdpa_causal"} <= kernels
    assert all("error" not in r and r["fwdbwd_ms"] > 0 for r in res["rows"])
    assert (out / "time.png").exists()
    printed = capsys.readouterr().out
    written = printed.split(f"wrote {out}/")[-1].strip().split(", ")
    assert written[0] == "results.json" and {"time.png", "time_fwd.png"} <= set(written), printed
    assert all((out / n).exists() for n in written), printed  # every file it names, and only those
    if not torch.cuda.is_available():
        assert "peers" in printed
        assert res["meta"]["graph"] is False and not (out / "time_graph.png").exists()  # no graphs on a CPU


def test_schedules():
    assert lr_factor(0, 100, "cosine", warmup=10) == pytest.approx(0.1)
    assert lr_factor(10, 100, "cosine", warmup=10) == pytest.approx(1.0)
    assert lr_factor(100, 100, "cosine", warmup=10, min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(50, 100, "wsd", warmup=10, decay_frac=0.2) == 1.0
    assert lr_factor(90, 100, "wsd", warmup=10, decay_frac=0.2, min_ratio=0.0) == pytest.approx(0.5)


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_bench_table_with_graph_columns():
    from ula.bench.runner import format_table
    row = dict(kernel="ula_none", kind="none", T=1024, fwd_ms=0.5, fwdbwd_ms=1.5, peak_mib=10.0)
    res = dict(meta=dict(graph=True), rows=[dict(row, fwd_graph_ms=0.125, fwdbwd_graph_ms=0.375),
                                             dict(row, kernel="peer", graph_error="RuntimeError('capture')")])
    lines = format_table(res).splitlines()
    assert "graph f+b" in lines[0]
    assert lines[1].split()[-2:] == ["0.125", "0.375"]
    assert "no graph: RuntimeError('capture')" in lines[2]
    assert "graph" not in format_table(dict(meta={}, rows=[row])).splitlines()[0]
