"""`ula train --context-parallel N` (ula/train/context_parallel.py) on CPU: two gloo processes sharing each
sequence (an odd --seq-len, split 17 / 16) take one training step with the same loss, validation loss and gradients
(<= 1e-5 relative) as one process on the whole sequence, and update the same parameters by AdamW's step from those
gradients; mixers that cannot are refused."""
import json
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from helpers import fresh_seed
from interpreter_speed import patch_language_once_per_launch
from ula.train import train
from ula.train.checkpoint import load_model
from ula.train.context_parallel import cp_mixers, slice_bounds
from ula.train.loop import param_groups

MIXERS = ("gla", "mlstm_exp", "mlstm_sig")
TOL = 1e-5
# gradients: float32 sums of decay-gradient terms that cancel, added in another order across ranks. Over 8 seeds the
# largest relative error was 4e-7 to 1.1e-6; seed 231053491 gave 1.1e-5 on GLA's two [16, 32] gate projections
# (norm 0.02, a third of the largest gradient), loss and parameters equal. A wrong join is off by far more.
GRAD_TOL = 1e-4


def _given(mixer, seed, cp=None):
    return dict(mixer=mixer, d_model=32, n_layers=2, n_heads=2, steps=1, batch_size=2, seq_len=33, lr=1e-3,
                warmup=0, schedule="constant", eval_every=1, eval_batches=1, save_every=100, seed=seed,
                context_parallel=cp)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rendezvous_port(rank, root, name):
    """The MASTER_PORT of one run: rank 0 picks a free port right before its rendezvous binds it and hands it to the
    other ranks in a file. Ports picked at the start for every run were free then, but not always tens of seconds
    later, when another test's process had taken one (EADDRINUSE in the full suite)."""
    path = os.path.join(root, f"port-{name}")
    if rank == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(_free_port()))
        os.replace(path + ".tmp", path)  # whole or absent to a reader
    deadline = time.time() + 300
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 gave no port for {name} in 300 s")
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


def _worker(rank, world, mixers, seed, root):
    patch_language_once_per_launch()
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    for mixer in mixers:
        # a fresh rendezvous per run (train() sets up and tears down)
        os.environ["MASTER_PORT"] = _rendezvous_port(rank, root, mixer)
        train(_given(mixer, seed, cp=world), out_dir=os.path.join(root, f"cp-{mixer}"), device="cpu", quiet=True)


def _result(out):
    """(training loss, validation loss, parameters, AdamW's first moments, AdamW's first step) after the step, the
    last three as lists in the optimizer's order. After one step the first moment m is (1 - β1) times the (clipped)
    gradient g and the second v is (1 - β2) g², so the step AdamW took (besides weight decay, which is the same in
    both runs) is lr · m̂ / (√v̂ + eps), with the bias corrections of step 1."""
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    ck = os.path.join(out, "checkpoints", "step-000001")
    model, _ = load_model(ck)
    name = {id(p): n for n, p in model.named_parameters()}
    order = [name[id(p)] for g in param_groups(model, 0.0) for p in g["params"]]
    params = load_file(os.path.join(ck, "model.safetensors"))
    opt = torch.load(os.path.join(ck, "trainer.pt"), weights_only=False)["optimizer"]
    (b1, b2), eps, lr = (opt["param_groups"][0][k] for k in ("betas", "eps", "lr"))
    state = [opt["state"][i] for i in range(len(order))]
    steps = [lr * (s["exp_avg"].double() / (1 - b1)) / ((s["exp_avg_sq"].double() / (1 - b2)).sqrt() + eps)
             for s in state]
    return (m["history"]["train"][0][1], m["final_val_loss"], [params[n] for n in order],
            [s["exp_avg"] for s in state], steps)


def test_one_step_with_context_parallel_2_equals_one_process(tmp_path, monkeypatch):
    seed = fresh_seed() % 2**31
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    mp.spawn(_worker, args=(2, MIXERS, seed, str(tmp_path)), nprocs=2, join=True)
    errs = {}
    for mixer in MIXERS:
        train(_given(mixer, seed), out_dir=str(tmp_path / f"one-{mixer}"), device="cpu", quiet=True)
        loss1, val1, p1, m1, s1 = _result(str(tmp_path / f"one-{mixer}"))
        loss2, val2, p2, m2, s2 = _result(str(tmp_path / f"cp-{mixer}"))
        assert len(p1) == len(p2) == len(m1) == len(m2)
        assert all(m.abs().max() > 0 for m in m1), "a parameter without gradient"
        # tensor by tensor, relative to the tensor's gradient, but to no less than 1e-3 of the largest one: a gate
        # projection's gradient can be 1e-5 of the others, a sum of decay-gradient terms that cancel (seed
        # 610823019: 1.4e-5 relative on a tensor of norm 6e-7 next to 2.7e-2, 1.7e-6 over the whole model)
        top = max(a.double().norm().item() for a in m1)
        e = {"loss": abs(loss2 - loss1) / abs(loss1), "val_loss": abs(val2 - val1) / abs(val1),
             # both runs start from the same parameters and take AdamW's step from their own moments, so the
             # parameters differ by the steps' difference (which can reach lr where a gradient element is near eps,
             # however close the moments, compared next): what is left is the parameters' float32 rounding
             "parameters": torch.cat([((b - a).double() + (y - x)).flatten() for a, b, x, y in zip(p1, p2, s1, s2)])
             .norm().item() / torch.cat([a.double().flatten() for a in p1]).norm().item(),
             "gradients": max((b - a).double().norm().item() / max(a.double().norm().item(), 1e-3 * top)
                              for a, b in zip(m1, m2))}
        errs[mixer] = {k: f"{v:.1e}" for k, v in e.items()}
        assert all(v <= (GRAD_TOL if k == "gradients" else TOL) for k, v in e.items()), \
            f"seed {seed}, {mixer}: {errs[mixer]}"
    print(errs)


def test_slices_cover_the_sequence():
    assert slice_bounds(33, 2) == [(0, 17), (17, 33)]
    assert slice_bounds(5, 4) == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_mixers_without_context_parallelism_are_refused(tmp_path):
    assert set(cp_mixers()) == set(MIXERS)
    with pytest.raises(ValueError, match="--mixer softmax cannot run with --context-parallel 2"):
        train(_given("softmax", 0, cp=2), out_dir=str(tmp_path / "sm"), device="cpu", quiet=True)
    with pytest.raises(ValueError, match="world size divisible by 2"):
        train(_given("gla", 0, cp=2), out_dir=str(tmp_path / "gla"), device="cpu", quiet=True)


def test_set_cp_group_names_the_mixer():
    from ula.layers._base import set_cp_group
    from ula.models import CausalLM, LMConfig
    model = CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, mixer="softmax"))
    with pytest.raises(ValueError, match="SoftmaxAttentionLayer"):
        set_cp_group(model, object())


def test_set_cp_group_needs_a_group_and_names_the_mixers_that_can():
    from ula.layers._base import set_cp_group
    from ula.models import CausalLM, LMConfig
    with pytest.raises(ValueError, match="the mixers that can: gla, mlstm_exp, mlstm_sig"):
        set_cp_group(CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, mixer="linear")), object())
    with pytest.raises(TypeError, match="ProcessGroup or None, got object"):
        set_cp_group(CausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, mixer="gla")), object())


def test_layer_errors_name_the_layer():
    from ula.layers import GLALayer, MLSTMLayer
    with pytest.raises(ValueError, match="^MLSTMLayer: variant"):
        MLSTMLayer(16, 2, variant="exponential")
    with pytest.raises(ValueError, match="^GLALayer: backend"):
        GLALayer(16, 2, backend="cuda")


def test_set_cp_group_refuses_the_demo_token_shift():
    """The demo's token shift reads the previous token, which lies on another rank for a slice's first one."""
    from ula.demo.model import demo_model
    from ula.layers._base import set_cp_group
    with pytest.raises(ValueError, match="ShiftEmbedding"):
        set_cp_group(demo_model("gla", 16, 32, 1, 2), object())


def _late_clock_worker(rank, world, root):
    """Rank 1's clock jumps a day, so its time budget is spent before the first step while rank 0's is not:
    the ranks must still stop after the same step (before: rank 1 validated while rank 0 trained, mismatched
    collectives)."""
    import datetime
    import types

    import torch.distributed as dist
    import ula.train.loop as loop
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=_rendezvous_port(rank, root, "late"))
    init = dist.init_process_group
    # a collective that one rank never joins fails in a minute instead of gloo's half hour
    dist.init_process_group = lambda *a, **k: init(*a, **dict(k, timeout=datetime.timedelta(seconds=60)))
    calls = []

    def clock():  # rank 1: a day passes right after the loop reads its start time
        calls.append(1)
        return time.perf_counter() + (86400.0 if rank == 1 and len(calls) > 1 else 0.0)
    loop.time = types.SimpleNamespace(perf_counter=clock, time=time.time)
    train(dict(_given("gla", 0, cp=world), steps=3, minutes=30), out_dir=os.path.join(root, "late"), device="cpu",
          quiet=True)


def test_time_budget_stops_every_rank_at_the_same_step(tmp_path, monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    mp.spawn(_late_clock_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    with open(tmp_path / "late" / "metrics.json") as f:
        assert json.load(f)["history"]["train"] == []  # rank 0 stopped with rank 1, before any step
