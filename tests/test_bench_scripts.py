"""The benchmark scripts' offline parts (no GPU): gpu_lm_table.py --merge joins calls' tables."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_lm_table.py")


def _table(mixers, args, device="GPU X", complete=True):
    rows = [dict(mixer=m, parameters=1e6, steps=10 + i, training_minutes=10.0, final_val_bpb=2.0 + i,
                 best_val_bpb=1.5 + i, best_at_step=5, val=[[5, 1.0, 1.5 + i]]) for i, m in enumerate(mixers)]
    return dict(command="gpu_lm_table.py", device=device, triton="3.6.0", minutes=10.0, complete=complete,
                train_args=args, setup="side by side", rows=rows)


def _merge(tmp_path, *tables):
    paths = []
    for i, t in enumerate(tables):
        paths.append(str(tmp_path / f"t{i}.json"))
        json.dump(t, open(paths[-1], "w"))
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, SCRIPT, "--merge", *paths], env=dict(os.environ, OUT=str(out)),
                       capture_output=True, text=True)
    return r, out


def test_merge_orders_rows_and_accepts_both_argument_formats(tmp_path):
    # older files hold the training flags as a list of strings, newer ones as a dict of numbers
    first = _table(["softmax", "gla"], ["--lr", "1e-3", "--schedule", "constant"])
    second = _table(["normalized"], {"--lr": 0.001, "--schedule": "constant"})
    r, out = _merge(tmp_path, first, second)
    assert r.returncode == 0, r.stderr
    res = json.load(open(out / "lm_table.json"))
    assert [row["mixer"] for row in res["rows"]] == ["gla", "normalized", "softmax"]  # the script's mixer order
    assert res["complete"] and "normalized alone" in res["setup"]
    md = open(out / "lm_table.md").read()
    assert "| normalized | 1.0M | 10 | 10.00 | 2.000 | 1.500 (5) |" in md
    assert (out / "lm_table.png").stat().st_size > 0


@pytest.mark.parametrize("change", ["device", "args"])
def test_merge_refuses_unlike_runs(tmp_path, change):
    first = _table(["gla"], {"--lr": 0.001})
    second = _table(["normalized"], {"--lr": 0.002} if change == "args" else {"--lr": 0.001},
                    device="GPU Y" if change == "device" else "GPU X")
    r, _ = _merge(tmp_path, first, second)
    assert r.returncode != 0 and "merge only runs made alike" in r.stderr


def test_core_vs_peers_rounds_give_medians_and_spread():
    """gpu_core_vs_peers.py --rounds: per kernel and shape the median over rounds, the f+b range, the largest peak;
    rows with an error are left out."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import gpu_core_vs_peers as cvp
    row = lambda k, fb, mem, rnd: dict(kernel=k, kind="none", shape="S", fwd_ms=fb / 4, fwdbwd_ms=fb,  # noqa: E731
                                       peak_mib=mem, round=rnd)
    rows = [row("ula_none", 1.0, 300, 0), row("ula_none", 1.6, 310, 1), row("ula_none", 1.1, 300, 2),
            row("fla", 2.0, 700, 0), dict(kernel="fla", shape="S", error="boom", round=1)]
    got = {r["kernel"]: r for r in cvp._summary(rows)}
    assert got["ula_none"]["fwdbwd_ms"] == 1.1 and got["ula_none"]["rounds"] == 3
    assert (got["ula_none"]["fwdbwd_min"], got["ula_none"]["fwdbwd_max"]) == (1.0, 1.6)
    assert got["ula_none"]["peak_mib"] == 310 and got["ula_none"]["fwd_ms"] == 1.1 / 4
    assert got["fla"]["rounds"] == 1 and got["fla"]["fwdbwd_ms"] == 2.0


def test_run_get_takes_the_median_over_rounds():
    """Run.get (ula/bench/script.py): one row gives its value, rows of several rounds their median (the checks of
    gpu_families_vs_peers.py --rounds), rows with an error or skipped do not count."""
    from ula.bench.script import Run
    run = Run.__new__(Run)
    run.rows = [dict(section="ops", case="gsa", fwdbwd_ms=5.0, round=0),
                dict(section="ops", case="gsa", fwdbwd_ms=4.0, round=1),
                dict(section="ops", case="gsa", fwdbwd_ms=9.0, round=2),
                dict(section="ops", case="gsa", error="boom", fwdbwd_ms=0.1, round=3),
                dict(section="ops", case="gla", fwdbwd_ms=3.0, shape="B2")]
    assert run.get("ops", "gsa", "fwdbwd_ms") == 5.0
    assert run.get("ops", "gsa", "fwdbwd_ms", round=2) == 9.0
    assert run.get("ops", "gla", "fwdbwd_ms") == 3.0 and run.get("ops", "gla", "shape") == "B2"
    assert run.get("ops", "abc", "fwdbwd_ms") is None


BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def test_gsa_variants_cpu_smoke_takes_each_variant():
    """benchmarks/gpu_gsa_variants.py --cpu-smoke (the interpreter, emulated bf16 matmuls): each variant changes
    the errors where it should (p_bf16, o1_bf16: more roundings; fast: the own block back in bf16; s_wide: s's
    gradients summed in float32), and the default is restored after the run."""
    env = dict(os.environ, TRITON_INTERPRET="1", ULA_EMULATE_BF16="1")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_gsa_variants.py"), "--cpu-smoke", "--q-shape",
                        "1,40,1,16,16", "--variants", "default,p_bf16,fast,o1_bf16,s_wide,default"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    errs = {}
    for i, line in enumerate(r.stdout.strip().splitlines()[-6:]):
        name, rest = line.split(" ", 1)
        errs[(i, name)] = eval(rest)  # the script prints a dict of floats
    default, p_bf16, fast, o1_bf16, s_wide, again = errs.values()
    assert p_bf16 != default and fast != default and o1_bf16 != default and again == default, errs
    assert s_wide["ds"] != default["ds"], errs


def test_families_graph_flag_adds_graph_checks(tmp_path):
    """gpu_families_vs_peers.py --graph (CPU smoke: no graphs there) repeats every time ratio check on the graph
    replays' numbers, n/a without a GPU."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_families_vs_peers.py"), "--cpu-smoke", "--sections",
                        "ops", "--ours", "linear,normalized", "--peers", "none", "--graph", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.load(open(tmp_path / "gpu_families_vs_peers_cpu_smoke.json"))
    tag = " (CUDA graph replays)"
    graph = [c for c in res["checks"] if c["claim"].endswith(tag)]
    eager = {c["claim"] for c in res["checks"] if not c["claim"].endswith(tag)}
    timed = {c for c in eager if "forward" in c}  # the time ratios (not the memory ones)
    assert {c["claim"][:-len(tag)] for c in graph} == timed and all(c["value"] is None for c in graph), graph


def test_repeat_calls_cpu_smoke():
    """benchmarks/gpu_repeat_calls.py --device cpu (the interpreter): each op called twice, forward and gradients,
    bitwise the same and close to float64 (float32 inputs here); the GPU run is what finds a kernel whose compiled
    code differs from call to call (RESULTS.md session 13: mLSTMexp's forward at 4 warps)."""
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_repeat_calls.py"), "--device", "cpu", "--shape",
                        "1,37,2,16,16", "--ops", "scalar,mlstm_exp,normalized", "--calls", "2", "--grad"],
                       env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"op"')]
    assert [x["op"] for x in lines] == ["scalar", "mlstm_exp", "normalized"], r.stdout
    for x in lines:
        assert x["bitwise_same"], x
        assert all(e < 1e-4 for call in x["errors_per_call"] for e in call), x
    assert r.stdout.strip().endswith("all the same")


def test_abc_fla_form_computes_fla_abc():
    """The benchmark op set against fla's chunk_abc ("abc_fla_form" of ula.bench.families: ula.gsa with s = φ,
    g = z_{t−1} − z_t) computes fla's ABC form, every earlier write rescaled by the current normalizer, as the
    step-by-step recurrence of benchmarks/cpu_abc_forms.py does (float64, fresh inputs); ula.abc, paper 004's Eq.
    3-4 as printed, does not."""
    import torch
    import ula
    from helpers import fresh_seed
    from ula.bench import families
    sys.path.insert(0, os.path.dirname(SCRIPT))
    from cpu_abc_forms import fla_form
    seed = fresh_seed()
    x = families.make("abc_fla_form", 2, 29, 2, 8, 8, "cpu", torch.float64, m=4, seed=seed)
    ref = fla_form(*(x[n].detach() for n in ("q", "k", "v", "w")))
    got = families.ours("abc_fla_form", backend="torch")(x)
    assert (got - ref).abs().max() < 1e-12, seed
    assert (ula.abc(x["q"], x["k"], x["v"], x["w"], backend="torch")[0] - ref).abs().max() > 1e-3, seed
    # gradients (w's through both gates) against autograd through the recurrence
    do = torch.randn_like(ref)
    names = ("q", "k", "v", "w")
    want = torch.autograd.grad(fla_form(*(x[n] for n in names)), [x[n] for n in names], do)
    have = torch.autograd.grad(got, [x[n] for n in names], do)
    for n, a, b in zip(names, have, want):
        assert (a - b).abs().max() < 1e-10 * (1 + b.abs().max()), (n, seed)
    # the Triton kernels (interpreted here), float32 with an odd length: the gates from its cumulative softmax
    x32 = {n: t.detach().float().requires_grad_() for n, t in x.items()}
    got32 = families.ours("abc_fla_form", backend="triton")(x32)
    assert (got32.double() - ref).abs().max() < 1e-4, seed
    have32 = torch.autograd.grad(got32, [x32[n] for n in names], do.float())
    for n, a, b in zip(names, have32, want):
        assert (a.double() - b).abs().max() < 1e-4 * (1 + b.abs().max()), (n, seed)
