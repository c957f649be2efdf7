"""Catalogue of bad inputs to every `ula` subcommand (issue 8, item 5): each one stops the command with
exit code 2 and one line on stderr naming the argument, what it got and what it needs, before any work
starts and before anything is written; and a failure while writing leaves what was there intact (the
last good checkpoint of `ula train` still loads and resumes, former results of demo and bench stay)."""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys

import matplotlib.figure
import pytest
import safetensors.torch
import torch

import ula.train.data as data_module
from ula.cli import main
from ula.models import CausalLM, LMConfig
from ula.train.checkpoint import load_model, load_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = ["--threads", "1"]           # tiny models: one thread is fastest, above all on a busy machine
TINY = ["--d-model", "16", "--heads", "2", "--layers", "1", "--seq-len", "16", "--batch-size", "2",
        "--eval-batches", "1", "--warmup", "1", "--device", "cpu"] + THREADS
TEXT = "The quick brown fox jumps over the lazy dog. " * 20


@pytest.fixture(autouse=True)
def keep_threads():
    """The commands set torch's thread count (--threads); the other tests get theirs back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def run_main(argv):
    try:
        return main(argv)
    except SystemExit as e:          # argparse stops there
        return e.code


def fails(capsys, argv, *needles, lines=1):
    """main(argv) exits with 2 and its stderr is `lines` lines, the last naming every needle."""
    rc = run_main([str(a) for a in argv])
    err = capsys.readouterr().err
    got = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert "Traceback" not in err and (len(got) == lines if lines else got), err
    for n in needles:
        assert str(n) in got[-1], (n, got[-1])
    return got[-1]


def ok(capsys, argv):
    assert run_main([str(a) for a in argv]) == 0, capsys.readouterr().err
    capsys.readouterr()


def digest(folder):
    return {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in sorted(os.listdir(folder))}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny finished `ula train` run (2 steps, checkpoints at 1 and 2) and its text file."""
    d = tmp_path_factory.mktemp("run")
    (d / "text.txt").write_text(TEXT)
    n = torch.get_num_threads()
    assert main(["train", str(d / "text.txt"), "--steps", "2", "--save-every", "1", "--eval-every", "2",
                 "--out", str(d / "run")] + TINY) == 0
    torch.set_num_threads(n)
    return d


# ---- numbers, names and choices: argparse stops them, one line, before any import of the work -------
NUMBERS = {
    "demo": [("--steps", "0", "integer >= 1"), ("--steps", "-3", "integer >= 1"), ("--seq-len", "0", ">= 1"),
             ("--num-kv", "-1", ">= 1"), ("--vocab-size", "0", ">= 1"), ("--d-model", "0", ">= 1"),
             ("--heads", "0", ">= 1"), ("--batch-size", "0", ">= 1"), ("--seeds", "0", ">= 1"),
             ("--lr", "0", "> 0"), ("--lr", "-0.01", "> 0"), ("--lr", "inf", "> 0"), ("--lr", "x", "number"),
             ("--jobs", "0", ">= 1"), ("--threads", "0", ">= 1"), ("--mixers", "gla,nope", "gla, gsa"),
             ("--mixers", ",", "comma-separated"), ("--device", "tpu", "cuda:N"), ("--prefix", "-2", ">= 0")],
    "train": [("--steps", "0", ">= 1"), ("--steps", "-1", ">= 1"), ("--steps", "2.5", "integer"),
              ("--seq-len", "0", ">= 1"), ("--batch-size", "-2", ">= 1"), ("--d-model", "0", ">= 1"),
              ("--layers", "0", ">= 1"), ("--heads", "0", ">= 1"), ("--lr", "0", "> 0"), ("--lr", "nan", "> 0"),
              ("--seed", "-1", "0 to 2**32 - 1"), ("--seed", str(2**32), "0 to 2**32 - 1"),
              ("--mixer", "transformer", "gla"), ("--warmup", "-1", ">= 0"), ("--clip", "-1", ">= 0"),
              ("--weight-decay", "-0.1", ">= 0"), ("--val-frac", "0", "between 0 and 1"),
              ("--val-frac", "1", "between 0 and 1"), ("--min-lr-ratio", "1.5", "from 0 to 1"),
              ("--eval-every", "0", ">= 1"), ("--eval-batches", "0", ">= 1"), ("--save-every", "0", ">= 1"),
              ("--minutes", "0", "> 0"), ("--schedule", "linear", "cosine"), ("--threads", "-4", ">= 1"),
              ("--device", "gpu", "auto, cpu, cuda")],
    "generate": [("--top-p", "0", "(0, 1]"), ("--top-p", "1.5", "(0, 1]"), ("--top-p", "-0.1", "(0, 1]"),
                 ("--temperature", "-1", ">= 0"), ("--temperature", "nan", ">= 0"), ("--top-k", "-1", ">= 0"),
                 ("--max-new-tokens", "-5", ">= 0"), ("--seed", "-2", "0 to 2**32 - 1"), ("--device", "x", "auto")],
    "bench": [("--seq-lens", "0", "integers >= 1"), ("--seq-lens", "64,-1", "integers >= 1"),
              ("--seq-lens", "a,b", "integers >= 1"), ("--seq-lens", ",", "integers >= 1"),
              ("--kinds", "none,exp", "none, constant"), ("--batch", "0", ">= 1"), ("--heads", "-1", ">= 1"),
              ("--head-dim", "0", ">= 1"), ("--reps", "0", ">= 1"), ("--threads", "0", ">= 1")],
}
CASES = [(cmd, *c) for cmd, cs in NUMBERS.items() for c in cs]


@pytest.mark.parametrize("cmd,flag,value,need", CASES, ids=[f"{c}{f}={v}" for c, f, v, _ in CASES])
def test_bad_number_or_name(tmp_path, capsys, cmd, flag, value, need):
    out = tmp_path / "out"
    head = [cmd, tmp_path / "ckpt"] if cmd == "generate" else [cmd, "--out", out]
    line = fails(capsys, head + [flag, value], f"ula {cmd}: error", flag, repr(value), need)
    assert "--help" in line and not out.exists()


def test_unknown_subcommand_and_flag(capsys):
    fails(capsys, ["fly"], "invalid choice", "'fly'", "demo")
    fails(capsys, ["train", "--stepz", "3"], "unrecognized arguments", "--stepz")


# ---- values that pass argparse but not together, or not with the data: stopped before any work -------
def test_demo_settings_that_do_not_fit(tmp_path, capsys):
    out = tmp_path / "out"
    base = ["demo", "--tiny", "--out", out, "--device", "cpu"] + THREADS
    fails(capsys, base + ["--seq-len", "7"], "--seq-len 7", "even", "at least --prefix + 4 * num_kv = 12")
    fails(capsys, base + ["--prefix", "3"], "--prefix 3", "even")
    fails(capsys, base + ["--num-kv", "8"], "--num-kv 8", "at least 18", "--vocab-size")
    fails(capsys, base + ["--d-model", "15"], "--d-model 15", "divisible by --heads 2")
    fails(capsys, base + ["--mixers", "hgrn2", "--d-model", "4", "--heads", "4"], "mixer hgrn2", "--d-model", "4",
          "makes no model")
    assert not out.exists()


def test_train_settings_that_do_not_fit(tmp_path, capsys, run):
    out = tmp_path / "out"
    base = ["train", run / "text.txt", "--out", out] + TINY
    fails(capsys, base + ["--heads", "3"], "--mixer gla", "--d-model 16", "--heads 3", "makes no model")
    fails(capsys, base + ["--seq-len", "600"], "has 900 bytes", "--seq-len 600", "training bytes")
    fails(capsys, base + ["--val-frac", "0.99"], "--val-frac 0.99", "a smaller --val-frac")
    assert not out.exists()


def test_text_paths(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    train = ["--out", out, "--steps", "1"] + TINY
    fails(capsys, ["train", tmp_path / "missing.txt"] + train, "missing.txt", "does not exist", "text file")
    (tmp_path / "empty.txt").write_bytes(b"")
    fails(capsys, ["train", tmp_path / "empty.txt"] + train, "empty.txt", "is empty", "needs at least")
    (tmp_path / "nothing").mkdir()
    fails(capsys, ["train", tmp_path / "nothing"] + train, "nothing", "is empty", "text file")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "a.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "binary" / "b.pt").write_bytes(b"\0\1\2")
    fails(capsys, ["train", tmp_path / "binary"] + train, "binary", "is empty", "2 binary files")
    secret = tmp_path / "secret.txt"
    secret.write_text(TEXT)
    with monkeypatch.context() as m:     # unreadable whoever runs the test (root reads a mode-000 file)
        def denied(path, *a, **k):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        m.setattr(data_module, "open", denied, raising=False)
        fails(capsys, ["train", secret] + train, "cannot read text file", "secret.txt", "Permission denied",
              "readable")
    if os.geteuid() != 0:
        secret.chmod(0)
        fails(capsys, ["train", secret] + train, "cannot read text file", "Permission denied")
    assert not out.exists()


def test_output_folder_not_writable(tmp_path, capsys, monkeypatch, run):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cmds = {"demo": ["demo", "--tiny", "--device", "cpu"] + THREADS,
            "train": ["train", run / "text.txt", "--steps", "1"] + TINY,
            "bench": ["bench", "--seq-lens", "16", "--kinds", "none", "--no-peers", "--reps", "1"] + THREADS}
    for cmd, argv in cmds.items():
        fails(capsys, argv + ["--out", afile], "--out", "afile", "is a file", "needs a folder")
        fails(capsys, argv + ["--out", afile / "sub"], "--out", "which is a file", "needs a folder")
        with monkeypatch.context() as m:  # a folder the user may not write (root writes a mode-555 one)
            m.setattr(os, "access", lambda *a, **k: False)
            fails(capsys, argv + ["--out", tmp_path / "ro" / "new"], "--out", "not writable", "can write")
    # resuming into the run folder of a checkpoint that cannot be written: the same, before any training
    with monkeypatch.context() as m:
        m.setattr(os, "access", lambda *a, **k: False)
        fails(capsys, ["train", "--resume", run / "run"] + THREADS, "the run folder of --resume", "not writable")
    if os.geteuid() != 0:
        ro = tmp_path / "readonly"
        ro.mkdir(mode=0o555)
        fails(capsys, cmds["bench"] + ["--out", ro / "x"], "--out", "not writable")
    assert sorted(os.listdir(tmp_path)) == ["afile"] + (["readonly"] if os.geteuid() != 0 else [])


# ---- checkpoints: missing, of another shape, corrupt or truncated ---------------------------------
def damaged(run, tmp_path, name, how):
    ck = tmp_path / name
    shutil.copytree(run / "run" / "checkpoints" / "step-000002", ck)
    how(ck)
    return ck


def truncate(path):
    b = path.read_bytes()
    path.write_bytes(b[:len(b) // 2])


def test_checkpoints(tmp_path, capsys, run):
    out = tmp_path / "out"
    gen = ["--max-new-tokens", "4", "--device", "cpu"]
    fails(capsys, ["generate", tmp_path / "nowhere"] + gen, "nowhere", "does not exist", "run folder")
    (tmp_path / "empty").mkdir()
    fails(capsys, ["generate", tmp_path / "empty"] + gen, "no checkpoint in", "checkpoints/step-NNNNNN")
    fails(capsys, ["train", "--resume", tmp_path / "nowhere", "--out", out] + THREADS, "nowhere", "does not exist")
    fails(capsys, ["train", "--resume", run / "run", "--d-model", "32", "--out", out] + THREADS,
          "another model shape", "d_model: checkpoint 16, asked 32")
    fails(capsys, ["train", "--resume", run / "run", "--mixer", "retnet", "--out", out] + THREADS,
          "another model shape", "mixer: checkpoint 'gla', asked 'retnet'")
    weights = damaged(run, tmp_path, "weights", lambda ck: truncate(ck / "model.safetensors"))
    config = damaged(run, tmp_path, "config", lambda ck: (ck / "config.json").write_text('{"d_model": 1'))
    fields = damaged(run, tmp_path, "fields", lambda ck: (ck / "config.json").write_text('{"width": 3}'))
    state = damaged(run, tmp_path, "state", lambda ck: truncate(ck / "trainer.pt"))
    junk = damaged(run, tmp_path, "junk", lambda ck: (ck / "trainer.pt").write_bytes(b"not a checkpoint\n" * 9))
    nostate = damaged(run, tmp_path, "nostate", lambda ck: (ck / "trainer.pt").unlink())
    for ck in (weights, config, fields):
        fails(capsys, ["generate", ck] + gen, "cannot load the model", ck.name, "corrupt, truncated")
        fails(capsys, ["train", "--resume", ck, "--out", out] + THREADS, "cannot load the model", ck.name)
    for ck in (state, junk):
        fails(capsys, ["train", "--resume", ck, "--out", out] + THREADS, "cannot load the training state", ck.name,
              "corrupt, truncated")
    fails(capsys, ["train", "--resume", nostate, "--out", out] + THREADS, "holds no trainer.pt", "cannot resume")
    ok(capsys, ["generate", nostate] + gen)           # the model alone still samples
    other = tmp_path / "vocab100"
    CausalLM(LMConfig(vocab_size=100, d_model=16, n_layers=1, n_heads=2)).save_pretrained(str(other))
    fails(capsys, ["generate", other] + gen, "vocab_size 100", "byte-level one (256)")
    assert not out.exists()


# ---- nothing half-written --------------------------------------------------------------------------
def partial_then_fail(real, fail_on):
    """A serializer that writes a few bytes where the real one would write, then fails (a full disk)
    on call number fail_on (1-based); the other calls go to the real one."""
    calls = []

    def fake(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) != fail_on:
            return real(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as fh:
                fh.write(b"PK\x03\x04half")
        else:
            f.write("{\"half\": " if "b" not in getattr(f, "mode", "b") else b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    return fake


def test_failed_save_keeps_last_good_checkpoint(tmp_path, capsys, monkeypatch, run):
    a, ref = tmp_path / "a", tmp_path / "ref"
    argv = ["train", run / "text.txt", "--steps", "4", "--save-every", "2", "--eval-every", "2"] + TINY
    with monkeypatch.context() as m:      # the step-4 save dies half-way through trainer.pt
        m.setattr(torch, "save", partial_then_fail(torch.save, 2))
        fails(capsys, argv + ["--out", a], "cannot write the checkpoint", "step-000004", "No space left on device",
              "left as it was", lines=0)
    assert os.listdir(a / "checkpoints") == ["step-000002"]           # no half checkpoint, no temporary
    assert not (a / "metrics.json").exists()
    model, ck = load_model(str(a))
    assert ck.endswith("step-000002") and load_trainer(ck)["step"] == 2
    ok(capsys, ["train", "--resume", a] + THREADS)                        # resumes from step 2, exactly
    ok(capsys, argv + ["--out", ref])
    got, want = (json.loads((d / "metrics.json").read_text())["history"]["train"] for d in (a, ref))
    assert [r[0] for r in got] == [1, 2, 3, 4] and got == want
    # overwriting a checkpoint of the same step (a resumed run already at its last step saves again)
    before = digest(a / "checkpoints" / "step-000004")
    with monkeypatch.context() as m:
        m.setattr(safetensors.torch, "save_file", partial_then_fail(safetensors.torch.save_file, 1))
        fails(capsys, ["train", "--resume", a] + THREADS, "cannot write the checkpoint", "step-000004", lines=0)
    assert digest(a / "checkpoints" / "step-000004") == before
    assert sorted(os.listdir(a / "checkpoints")) == ["step-000002", "step-000004"]
    ok(capsys, ["train", "--resume", a] + THREADS)
    assert load_trainer(str(a / "checkpoints" / "step-000004"))["step"] == 4


@pytest.mark.parametrize("cmd", ["demo", "bench", "train"])
def test_failed_results_write_leaves_former_files(tmp_path, capsys, monkeypatch, run, cmd):
    out = tmp_path / "out"
    out.mkdir()
    names = {"demo": ["results.json", "mqar.png"], "bench": ["results.json", "time.png"],
             "train": ["metrics.json", "loss.png"]}[cmd]
    for n in names:
        (out / n).write_text(f"former {n}")
    argv = {"demo": ["demo", "--tiny", "--mixers", "linear", "--device", "cpu"] + THREADS,
            "bench": ["bench", "--seq-lens", "16", "--kinds", "none", "--no-peers", "--reps", "1"] + THREADS,
            "train": ["train", run / "text.txt", "--steps", "1"] + TINY}[cmd] + ["--out", out]
    json_call = 2 if cmd == "train" else 1        # train: the checkpoint's config.json comes first
    for target, attr, n, call in ((json, "dump", names[0], json_call),
                                  (matplotlib.figure.Figure, "savefig", names[1], 1)):
        with monkeypatch.context() as m:     # savefig: a method, the figure first and the path second
            m.setattr(target, attr, partial_then_fail(getattr(target, attr), call))
            fails(capsys, argv, "cannot write", "plots in" if n == "time.png" else n, "No space left on device",
                  "left as it was", lines=0)
        kept = [f for f in os.listdir(out) if f != "checkpoints"]
        assert sorted(kept) == sorted(names), kept                       # no temporaries left
        assert all((out / f).read_text() == f"former {f}" for f in names[names.index(n):])


# ---- what the user sees: the real command, its exit code and stderr ------------------------------
def test_command_line_shows_one_line_and_no_traceback(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = [["train", "--steps", "0"], ["generate", str(tmp_path / "none")], ["bench", "--seq-lens", "0"],
             ["demo", "--tiny", "--seq-len", "7", "--out", str(tmp_path / "d"), "--device", "cpu"],
             ["train", str(tmp_path / "empty"), "--out", str(tmp_path / "t"), "--device", "cpu"]]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-m", "ula"] + c, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in cases]
    for c, p in zip(cases, procs):
        _, err = p.communicate(timeout=120)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in err, (c, err)
        assert lines[0].startswith(f"ula {c[0]}: error: "), (c, err)
    assert sorted(os.listdir(tmp_path)) == ["empty"]


def test_bench_graph_needs_a_gpu(tmp_path, capsys):
    """--graph times CUDA-graph replays: on a CPU run it is refused by name before any timing, and no folder is left."""
    out = tmp_path / "b"
    fails(capsys, ["bench", "--seq-lens", "16", "--kinds", "none", "--no-peers", "--device", "cpu", "--graph",
                   "--out", out] + THREADS, "--graph", "needs a CUDA GPU", "leave --graph out")
    assert not out.exists()
