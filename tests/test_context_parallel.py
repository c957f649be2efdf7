"""Context parallelism (ula/core/context_parallel.py) on CPU: 2 and 4 processes with the gloo backend, each
holding a contiguous (unequal) slice of T; outputs, final states and all gradients equal the single-process
`ula.linear_attention` (and gla, mlstm sig / exp) on the whole sequence: float32 ranks within 1e-5 (relative) of
one float64 process, or within 10x what one float32 process misses it by where a sum cancels.
Many cases run inside one spawned group (spawning is the slow part)."""
import datetime
import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ula
from helpers import KINDS, fresh_seed, make_inputs, record_launches, rel
from interpreter_speed import patch_language_once_per_launch
from ula.core import time_split

TOL = 1e-5
NAMES = ("q", "k", "v", "ld", "rd", "initial_state")


def _slices(R, T):
    """Unequal slice lengths summing to T (one rank gets a single token with 4 ranks)."""
    return {2: [T // 3, T - T // 3], 4: [7, 1, T - 7 - 1 - 13, 13]}[R]


def _cases(R):
    cases = []
    for kind in KINDS:
        for right in (False, True):
            for reverse in (False, True):
                cases.append(dict(kind=kind, right=right, reverse=reverse, varlen=False, B=2, T=61, h0=True,
                                  final=True))
    for kind in KINDS:
        for reverse in (False, True):
            # boundaries inside ranks, one exactly on a rank boundary, one sequence over several ranks
            cu = {2: [0, 9, 20, 45, 61], 4: [0, 3, 7, 30, 50, 61]}[R]
            cases.append(dict(kind=kind, right=kind != "none", reverse=reverse, varlen=cu, B=1, T=61, h0=True,
                              final=True))
    cases.append(dict(kind="vector", right=True, reverse=False, varlen=False, B=1, T=61, h0=False, final=False))
    cases.append(dict(kind="scalar", right=False, reverse=True, varlen=[0, 61], B=1, T=61, h0=False, final=True))
    cases.append(dict(kind="vector", right=False, reverse=False, varlen=False, B=2, T=61, h0=True, final=True,
                      h0_rank0_only=True))
    # the Triton kernels (the interpreter on CPU), with the entry term's own kernels (ula/core/triton/entry.py)
    cases.append(dict(kind="scalar", right=False, reverse=False, varlen=False, B=2, T=61, h0=True, final=True,
                      backend="triton"))
    cases.append(dict(kind="vector", right=False, reverse=False, varlen={2: [0, 9, 45, 61], 4: [0, 3, 30, 61]}[R],
                      B=1, T=61, h0=True, final=True, backend="triton"))
    # (the Triton cases below are rank-count independent: 2 ranks only, for the interpreter's time; the two above
    # take 4 ranks too, a sequence over all of them and the entry kernels on the middle ranks)
    two = R == 2
    # a constant decay's entry gradient is not added in place (ld is [H]: cp_entry.DeferredGrads.finish)
    if two:
        cases.append(dict(kind="constant", right=False, reverse=False, varlen=False, B=2, T=61, h0=False, final=False,
                          backend="triton"))
    # each rank's slice split in two along T on its own device (ula/core/time_split.py, forced): the segments'
    # backward initial states take the slice's entering state, decayed to each segment; equal slices of whole chunks
    for kind in ("vector", "none") if two else ():
        cases.append(dict(kind=kind, right=False, reverse=False, varlen=False, B=1, T=256, h0=True, final=True,
                          backend="triton", slices={2: [128, 128]}, split="2", mild=True,
                          V=20 if kind == "none" else 12))  # V = 20: padded to 32, the slice's entering state not
    cases.append(dict(op="gla", varlen=False, B=2, T=61, h0=True, final=True))
    cases.append(dict(op="gla", varlen=[0, 5, 40, 61], B=1, T=61, h0=True, final=True))
    cases.append(dict(op="mlstm_sig", varlen=False, B=2, T=61, h0=True, final=True))
    cases.append(dict(op="mlstm_sig", varlen=[0, 20, 61], B=1, T=61, h0=True, final=True))
    # the input gate as the kernels' own key gate on every rank's local pass (Triton, interpreted)
    if two:
        cases.append(dict(op="mlstm_sig", varlen=False, B=1, T=61, h0=True, final=True, backend="triton"))
        cases.append(dict(op="mlstm_exp", varlen=False, B=1, T=61, h0=True, final=True, backend="triton"))
    # a width the Triton path pads (V = 20 -> 32; mLSTMexp's [v, 1] 21 -> 32): the entering state given to the
    # core's backward is padded too (on 2 H200s its bf16 dq on rank 1 was 2.4 from float32 before)
    if two:
        cases.append(dict(kind="scalar", right=False, reverse=False, varlen=False, B=1, T=61, h0=True, final=True,
                          backend="triton", V=20))
        cases.append(dict(op="mlstm_exp", varlen=False, B=1, T=61, h0=True, final=True, backend="triton", V=20))
        # input gates far below 0: every slice's own max over i − F is below the entering state's (each rank's
        # crossing max state comes from the gate kernels with a floor that must sit below it, not at 0)
        cases.append(dict(op="mlstm_exp", varlen=False, B=2, T=61, h0=False, final=True, backend="triton", low=True))
        # packed sequences on the ones kernels: the backward's entering [S | n] one row per piece (the entry piece's E,
        # the initial state's rows where sequences start)
        cases.append(dict(op="mlstm_exp", varlen=[0, 9, 45, 61], B=1, T=61, h0=True, final=True, backend="triton"))
    # mLSTMexp: the max state m crosses the ranks too; its initial state is the tuple (C, n, m)
    cu = {2: [0, 9, 20, 45, 61], 4: [0, 3, 7, 30, 50, 61]}[R]
    cases.append(dict(op="mlstm_exp", varlen=False, B=2, T=61, h0=True, final=True))
    cases.append(dict(op="mlstm_exp", varlen=False, B=2, T=61, h0=True, final=True, h0_rank0_only=True))
    cases.append(dict(op="mlstm_exp", varlen=False, B=1, T=61, h0=False, final=False))
    cases.append(dict(op="mlstm_exp", varlen=cu, B=1, T=61, h0=True, final=True))
    cases.append(dict(op="mlstm_exp", varlen=[0, 61], B=1, T=61, h0=False, final=True))
    # a large input gate early on: the max state set on the first rank rules the later ranks' outputs
    cases.append(dict(op="mlstm_exp", varlen=False, B=2, T=61, h0=False, final=True, spike=True))
    cases.append(dict(op="mlstm_exp", varlen=False, B=2, T=61, h0=True, final=True, extreme=True))
    return cases


def _inputs(case, H=2, K=8, V=12):
    B, T = case["B"], case["T"]
    N = len(case["varlen"]) - 1 if case["varlen"] else None
    op = case.get("op", "core")
    if op == "core":
        q, k, v, ld, rd, s0 = make_inputs(case["kind"], case["right"], B, T, H, K, V, h0=case["h0"], N=N)
        if case.get("mild") and ld is not None:  # a state that lasts across segments of 64-128 steps
            ld = ld * 0.05
        return q, k, v, ld, rd, s0
    q, k, v, _, _, s0 = make_inputs("none", False, B, T, H, K, V, h0=case["h0"], N=N)
    if op == "gla":
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K) + 3.0)
        return q, k, v, g, None, s0
    i, f = torch.randn(B, T, H), torch.randn(B, T, H) + 2.0  # mlstm: (i, f) in the ld, rd slots
    if op == "mlstm_sig":
        return q, k, v, i, f, s0
    # exp: positive q, k keep |nᵀq| away from 0 (h is ill-conditioned there; see tests/test_ops_mlstm.py)
    q, k = q.abs() + 0.1, k.abs() + 0.1
    i = i * 3
    if case.get("spike"):  # forget gates near 1: the max state set at t = 2 stays the max to the end, while the
        # other inputs (weights exp(i - m) ~ 0.1..1) keep the state from being one token (dq would be ~0 then)
        i, f = torch.rand(B, T, H) * 2.5 + 3.0, f + 4.0
        i[:, 2] = 6.0
    if case.get("low"):
        i, f = torch.randn(B, T, H) - 8.0, f + 4.0
    if case.get("extreme"):
        i, f = torch.rand(B, T, H) * 60 - 30, torch.rand(B, T, H) * 16 - 6
    if s0 is not None:
        s0 = (s0, torch.randn(s0.shape[:3]).abs(), torch.randn(s0.shape[:2]))
    return q, k, v, i, f, s0


def _call(case, q, k, v, a, b, s0, cu, group):
    op = case.get("op", "core")
    kw = dict(initial_state=s0, output_final_state=case["final"], cu_seqlens=cu, chunk_size=16,
              backend=case.get("backend", "torch"))
    if op == "core":
        return ula.linear_attention(q, k, v, a, b, reverse=case["reverse"], cp_group=group, **kw)
    if op == "gla":
        return ula.gla(q, k, v, a, cp_group=group, **kw)
    return ula.mlstm(q, k, v, a, b, variant=op[6:], cp_group=group, **kw)


def _flat(full):
    """(names, tensors): the inputs with an mLSTMexp state tuple (C, n, m) spread out."""
    *head, s0 = full
    if isinstance(s0, tuple):
        return NAMES[:5] + ("initial_C", "initial_n", "initial_m"), list(head) + list(s0)
    return NAMES, list(full)


def _unflat(xs):
    return xs[:5] + [xs[5] if len(xs) == 6 else (None if xs[5] is None else tuple(xs[5:]))]


def _states(S):
    return list(S) if isinstance(S, tuple) else [S]


def _run_case(case, seed, rank, R, group):
    torch.manual_seed(seed)
    names, full = _flat(_inputs(case, V=case.get("V", 12)))
    B, T = case["B"], case["T"]
    cu = torch.tensor(case["varlen"]) if case["varlen"] else None
    do = torch.randn(B, T, *full[2].shape[2:])
    # single process on the whole sequence, through the torch backend (the ranks' backend is the one under test;
    # the Triton interpreter would run the whole sequence twice more on every rank)
    one = dict(case, backend="torch")
    ref = [None if x is None else x.clone().requires_grad_() for x in full]
    o_ref, S_ref = _call(one, *_unflat(ref), cu, None)
    S_ref = _states(S_ref) if S_ref is not None else None
    dS = [torch.randn_like(x) for x in S_ref] if S_ref is not None else None
    loss = (o_ref * do).sum() + (sum((x * d).sum() for x, d in zip(S_ref, dS)) if dS is not None else 0)
    loss.backward()
    # the same single process in float64: the truth, and how far float32 itself is from it (mLSTMexp's dm0 under
    # extreme gates is a sum that cancels; float32 misses it by up to 5e-1 on one process alone)
    ref64 = [None if x is None else x.double().requires_grad_() for x in full]
    o64, S64 = _call(one, *_unflat(ref64), cu, None)
    loss = (o64 * do.double()).sum()
    if dS is not None:
        loss = loss + sum((x * d.double()).sum() for x, d in zip(_states(S64), dS))
    loss.backward()
    # this rank's slice
    lengths = case["slices"][R] if "slices" in case else _slices(R, T)
    s = sum(lengths[:rank])
    e = s + lengths[rank]

    def cut(name, x):
        if x is None:
            return None
        if name.startswith("initial"):
            if case.get("h0_rank0_only") and rank != 0:
                return None
            return x.clone().requires_grad_()
        if x.dim() == 1:  # constant decay [H]: the whole tensor on every rank
            return x.clone().requires_grad_()
        return x[:, s:e].clone().requires_grad_()

    mine = [cut(n, x) for n, x in zip(names, full)]
    time_split._FORCED = case.get("split")  # the ranks' calls only (the references above are not split)
    try:
        o, S = _call(case, *_unflat(mine), cu, group)
    finally:
        time_split._FORCED = None
    loss = (o * do[:, s:e]).sum()
    if dS is not None and rank == 0:  # the final state is replicated: its loss on one rank only
        loss = loss + sum((x * d).sum() for x, d in zip(_states(S), dS))
    loss.backward()
    # gather outputs and gradients (sums over ranks of full-size buffers)
    o_full = torch.zeros_like(o_ref)
    o_full[:, s:e] = o.detach()
    dist.all_reduce(o_full, group=group)
    # (error of the ranks against float64, error of one float32 process against float64)
    errs = {"o": (rel(o_full, o64), rel(o_ref, o64))}
    if S_ref is not None:
        for j, (x, r, r64) in enumerate(zip(_states(S), S_ref, _states(S64))):
            errs[f"final_state{j or ''}"] = (rel(x, r64), rel(r, r64))
    for name, x, r, r64 in zip(names, mine, ref, ref64):
        if r is None:
            continue
        g = torch.zeros_like(r)
        if x is not None and not (name.startswith("initial") and x.grad is None):  # unused on this rank: no grad
            assert x.grad is not None, f"no gradient for {name} on rank {rank}"
            if name.startswith("initial") or x.dim() == 1:
                g += x.grad
            else:
                g[:, s:e] = x.grad
        dist.all_reduce(g, group=group)
        errs["d" + name] = (rel(g, r64.grad), rel(r.grad, r64.grad))
    return errs


def _bad_inputs_raise_everywhere(rank, R, group):
    """A shape that differs on one rank raises ValueError on every rank (no hang)."""
    H = 3 if rank == R - 1 else 2
    q = torch.randn(1, 5, H, 8)
    i = torch.randn(1, 5, H)
    ok = []
    for call in (lambda: ula.linear_attention(q, q, q, cp_group=group),
                 lambda: ula.mlstm(q, q, q, i, i, variant="exp", cp_group=group)):
        try:
            call()
            ok.append(False)
        except ValueError as e:
            ok.append("same H" in str(e))
    return all(ok)


def _raises_everywhere(call, *words):
    """call() raises ValueError or TypeError whose message holds every one of `words` (any, if none)."""
    try:
        call()
    except (ValueError, TypeError) as e:
        return all(w in str(e) for w in words)
    return False


def _mismatches_raise_everywhere(rank, R, group):
    """Inputs that differ between ranks, or fail an op's own checks on one rank only, raise on every rank (the
    others must not wait in a collective for it); names the case that failed."""
    last = rank == R - 1
    q = torch.randn(1, 8, 2, 8)
    i = torch.randn(1, 8, 2)
    # cu_seqlens whose weighted sums (the old digest) agree: [0, 1, 14, 20] and [0, 4, 12, 20]
    x = torch.randn(1, 20 // R, 2, 8)
    cu = torch.tensor([0, 4, 12, 20] if last else [0, 1, 14, 20])
    bad_g = torch.randn(1, 8, 2, 7 if last else 8).clamp(max=0)
    checks = {
        "cu_seqlens differ": _raises_everywhere(lambda: ula.linear_attention(x, x, x, cu_seqlens=cu, cp_group=group),
                                                "cu_seqlens"),
        "dtypes differ": _raises_everywhere(lambda: ula.linear_attention(*(q.double() if last else q,) * 3,
                                                                         cp_group=group), "dtypes"),
        "mlstm exp dtypes differ": _raises_everywhere(lambda: ula.mlstm(*(q.double() if last else q,) * 3, i, i,
                                                                        cp_group=group), "dtypes"),
        "gla g on one rank": _raises_everywhere(lambda: ula.gla(q, q, q, bad_g, cp_group=group),
                                                *(("g",) if last else ("rank(s) [", str(R - 1)))),
        "mlstm sig i on one rank": _raises_everywhere(
            lambda: ula.mlstm(q, q, q, i[..., :1] if last else i, i, variant="sig", cp_group=group)),
        "mlstm eps on one rank": _raises_everywhere(
            lambda: ula.mlstm(q, q, q, i, i, eps=-1.0 if last else 1e-6, cp_group=group)),
        "key_gate on one rank": _raises_everywhere(
            lambda: ula.linear_attention(q, q, q, key_gate=i[..., :1] if last else i, cp_group=group)),
    }
    # mLSTMexp's state in another dtype, given where the sequence starts only (the first rank): before the op checked
    # it, its core call raised there alone and the other ranks waited in the state gather
    st = tuple(torch.zeros(shape, dtype=torch.bfloat16) for shape in ((1, 2, 8, 8), (1, 2, 8), (1, 2)))
    checks["mlstm exp bfloat16 state on the first rank"] = _raises_everywhere(
        lambda: ula.mlstm(q, q, q, i, i, initial_state=st if rank == 0 else None, cp_group=group),
        *(("initial_state", "float32") if rank == 0 else ("rank(s) [0]",)))
    # an initial state that requires grad on the first rank only: the message says where it must go
    h0 = torch.randn(1, 2, 8, 8, requires_grad=True) if rank == 0 else None
    checks["initial_state requiring grad on one rank"] = _raises_everywhere(
        lambda: ula.linear_attention(q, q, q, initial_state=h0, cp_group=group), "initial_state", "every rank")
    return [name for name, ok in checks.items() if not ok]


def _state_edge_cases(rank, R, group, seed):
    """float64 slices without an initial state return a float64 final state (equal to one process's); an initial
    state that is the only input needing grad, passed on every rank, gets its gradient on the first rank (the
    single-process one) and zeros elsewhere, every rank's backward completing. Returns the names of failed checks."""
    torch.manual_seed(seed)
    T, n = 6 * R, 6
    s = slice(rank * n, (rank + 1) * n)
    q, k, v = (torch.randn(1, T, 2, 8, dtype=torch.float64) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 2, dtype=torch.float64) + 2)
    bad = []
    _, S1 = ula.linear_attention(q, k, v, g, output_final_state=True)
    _, S = ula.linear_attention(q[:, s], k[:, s], v[:, s], g[:, s], output_final_state=True, cp_group=group)
    if S.dtype != torch.float64 or rel(S, S1) > 1e-12:
        bad.append(f"float64 final state: {S.dtype}, {rel(S, S1):.1e}")
    h32 = torch.randn(1, 2, 8, 8)  # a float32 initial state beside float64 inputs: still a float64 final state
    _, S1 = ula.linear_attention(q, k, v, g, initial_state=h32, output_final_state=True)
    _, S = ula.linear_attention(q[:, s], k[:, s], v[:, s], g[:, s], initial_state=h32, output_final_state=True,
                                cp_group=group)
    if S.dtype != S1.dtype or rel(S, S1) > 1e-12:
        bad.append(f"float64 final state from a float32 initial state: {S.dtype}, {rel(S, S1):.1e}")
    h0 = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    do = torch.randn(1, T, 2, 8, dtype=torch.float64)
    one = h0.clone().requires_grad_()
    o1, _ = ula.linear_attention(q, k, v, g, initial_state=one)
    (o1 * do).sum().backward()
    mine = h0.clone().requires_grad_()
    o, _ = ula.linear_attention(q[:, s], k[:, s], v[:, s], g[:, s], initial_state=mine, cp_group=group)
    if not o.requires_grad:
        bad.append("initial_state alone needing grad: the output does not require grad")
    else:
        (o * do[:, s]).sum().backward()
        want = one.grad if rank == 0 else torch.zeros_like(h0)
        if mine.grad is None or rel(mine.grad, want) > 1e-12:
            bad.append(f"initial_state gradient: {None if mine.grad is None else rel(mine.grad, want)}")
    return bad


def _lm_one_token_slice(rank, R, group, seed):
    """A CausalLM (GLA, float64) with context parallelism continues from its cache with the last rank holding one
    token: the same logits as one process (that rank took the recurrent step, joined no collective and left the
    others waiting). Returns the names of failed checks."""
    from ula.layers._base import set_cp_group
    from ula.models import CausalLM, LMConfig
    torch.manual_seed(seed)
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, mixer="gla")).double()
    prefix, cont = torch.randint(0, 32, (1, 2 * R)), torch.randint(0, 32, (1, 2 * R - 1))
    with torch.no_grad():
        _, cache = model(prefix)
        want, _ = model(cont, cache=cache)
        set_cp_group(model, group)
        _, cache = model(prefix[:, 2 * rank:2 * rank + 2])
        got, _ = model(cont[:, 2 * rank:2 * rank + 2], cache=cache)  # the last rank: one token
    return [] if rel(got, want[:, 2 * rank:2 * rank + 2]) < 1e-10 else [f"logits {rel(got, want[:, 2 * rank:]):.1e}"]


def _metadata_gathers(rank, R, group, seed):
    """Each family's context-parallel call holds the host for ONE metadata gather (`agree`), forward and backward:
    mLSTMexp agrees on its inputs before its max-state scan and hands the result to its core call (`agreed`), which
    would otherwise gather the same facts again (a second wait for the slowest rank). Its output still matches one
    process. Returns the names of failed checks."""
    from ula.core import context_parallel as cpm
    torch.manual_seed(seed)
    T, n = 8 * R, 8
    q, k, v = (torch.randn(1, T, 2, 16, dtype=torch.float64) for _ in range(3))
    i, f = torch.randn(1, T, 2, dtype=torch.float64), torch.randn(1, T, 2, dtype=torch.float64) + 2
    s = slice(rank * n, (rank + 1) * n)
    real, calls, failed = cpm._gather_ints, [], []

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    cpm._gather_ints = counted
    try:
        for variant in ("exp", "sig"):
            want, _ = ula.mlstm(q, k, v, i, f, variant)
            calls.clear()
            x = [t[:, s].clone().requires_grad_() for t in (q, k, v, i, f)]
            got, _ = ula.mlstm(*x, variant, cp_group=group)
            got.sum().backward()
            if len(calls) != 1:
                failed.append(f"{variant}: {len(calls)} metadata gathers")
            if not rel(got, want[:, s]) < 1e-10:
                failed.append(f"{variant}: output {rel(got, want[:, s]):.1e} from one process")
    finally:
        cpm._gather_ints = real
    return failed


def _ones_backward_reads_borders(rank, R, group, seed):
    """mLSTMexp on the kernels: every rank's backward, from the entering state or not, takes the forward's column
    borders (NGIVEN, with the entering column added: ula/core/triton/state_join.add_entering_column) instead of
    summing the column again in its second state call. Returns the names of failed checks."""
    torch.manual_seed(seed)
    T, n = 16 * R, 16  # one chunk per rank: the interpreter's time is the suite's
    q, k, v = (torch.randn(1, T, 1, 16) for _ in range(3))
    i, f = torch.randn(1, T, 1), torch.randn(1, T, 1) + 2
    s = slice(rank * n, (rank + 1) * n)
    with pytest.MonkeyPatch.context() as patch:  # no fixture in a spawned rank
        seen = record_launches(patch, lambda kernel, w, cx, st: (int(cx["ONES"]), int(cx["NGIVEN"]), int(cx["HAS_X"]))
                               if kernel.fn.__name__ == "_state_kernel" else None)
        x = [t[:, s].clone().requires_grad_() for t in (q, k, v, i, f)]
        got, _ = ula.mlstm(*x, "exp", cp_group=group, backend="triton", chunk_size=16)
        got.sum().backward()
    return [] if (0, 1, 1) in seen and (1, 0, 1) not in seen else [f"state kernel launches {seen}"]


def _bf16_close(rank, R, group, seed):
    """bfloat16 inputs (the correction runs as a bfloat16 matmul): the slice outputs within 1e-2 of one float32
    process on the same (bf16-rounded) inputs, scalar and vector decay."""
    torch.manual_seed(seed)
    T, n = 40 * R, 40
    q, k, v = (torch.randn(1, T, 2, 16).bfloat16() for _ in range(3))
    ok = []
    for shape in ((1, T, 2), (1, T, 2, 16)):
        g = torch.nn.functional.logsigmoid(torch.randn(shape) + 3)
        o_ref, _ = ula.linear_attention(q.float(), k.float(), v.float(), g)
        s = slice(rank * n, (rank + 1) * n)
        o, _ = ula.linear_attention(q[:, s], k[:, s], v[:, s], g[:, s], cp_group=group)
        ok.append(o.dtype == torch.bfloat16 and rel(o.float(), o_ref[:, s]) < 1e-2)
    return all(ok)


def _worker(rank, R, init, seed, out):
    patch_language_once_per_launch()
    # a collective that one rank never joins fails after the timeout instead of hanging the suite
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=R, timeout=datetime.timedelta(seconds=90))
    torch.set_num_threads(1)
    try:
        group = dist.group.WORLD
        results = []
        for n, case in enumerate(_cases(R)):
            errs = _run_case(case, seed + n, rank, R, group)
            results.append(dict(case=case, errs=errs))
        results.append(dict(case="bad inputs raise on every rank", ok=_bad_inputs_raise_everywhere(rank, R, group)))
        results.append(dict(case="bfloat16 slices close to float32", ok=_bf16_close(rank, R, group, seed)))
        for name, failed in (("mismatches raise on every rank", _mismatches_raise_everywhere(rank, R, group)),
                             ("state edge cases", _state_edge_cases(rank, R, group, seed)),
                             ("a model's one-token slice", _lm_one_token_slice(rank, R, group, seed)),
                             ("one metadata gather per call", _metadata_gathers(rank, R, group, seed)),
                             ("ones backward reads the forward's borders",
                              _ones_backward_reads_borders(rank, R, group, seed))):
            results.append(dict(case=f"{name}: {failed} (rank {rank})", ok=not failed))
        with open(f"{out}.{rank}", "w") as f:
            json.dump(results, f)
    finally:
        dist.barrier()  # no rank tears gloo down while another still talks to it (that aborts the process)
        dist.destroy_process_group()


@pytest.mark.parametrize("R", [2, 4])
def test_context_parallel_equals_single_process(R):
    seed = fresh_seed()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "results")
        # a file store, not a TCP port: a port picked free here could be taken by another test's process before
        # rank 0 binds it, seconds later (EADDRINUSE, seen in tests/test_train_cp.py)
        init = f"file://{os.path.join(d, 'rendezvous')}"
        try:
            mp.spawn(_worker, args=(R, init, seed, out), nprocs=R, join=True)
        except mp.ProcessExitedException as e:
            # gloo now and then aborts a process while it shuts down ("terminate called without an active
            # exception"), after the results are written; a crash before that leaves a file missing below
            if not all(os.path.exists(f"{out}.{r}") for r in range(R)):
                raise
            print(f"a rank died after writing its results ({e})")
        results = [json.load(open(f"{out}.{r}")) for r in range(R)]
    bad = []
    for rank_results in results:
        for res in rank_results:
            if "ok" in res:
                if not res["ok"]:
                    bad.append(res["case"])
                continue
            # the ranks may miss the float64 truth by TOL, or by 10x what one float32 process misses it by where
            # the sum is ill-conditioned; a constant decay's gradient is one sum over B*T steps whose terms
            # cancel (summed over ranks here): 1e-3 as in tests/test_extreme.py and tests/test_property.py
            tol = {"dld": 1e-3} if res["case"].get("kind") == "constant" else {}
            over = {k: f"{e:.2e} (one process {e1:.2e})" for k, (e, e1) in res["errs"].items()
                    if not e <= max(tol.get(k, TOL), 10 * e1)}
            if over:
                bad.append((res["case"], over))
    assert not bad, f"{R} ranks, seed {seed}: {bad[:6]}"


def test_mlstm_exp_cp_group_must_be_a_process_group():
    q = torch.randn(1, 4, 1, 8)
    i = torch.randn(1, 4, 1)
    with pytest.raises(TypeError, match="ProcessGroup"):
        ula.mlstm(q, q, q, i, i, variant="exp", cp_group=object())


def test_cp_group_must_be_a_process_group():
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises((TypeError, RuntimeError)):
        ula.linear_attention(q, q, q, cp_group=object())


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("right", [False, True], ids=["left", "right"])
@pytest.mark.parametrize("decay", ["none", "constant", "scalar", "vector"])
def test_entry_term_gradients(decay, right, reverse):
    """The entering state's term (ula/core/cp_entry.py, its own backward) against finite differences in float64:
    q, both decays (a constant one broadcast over B and T, as the core canonicalizes it) and the state."""
    from ula.core.cp_entry import entry_term
    fresh_seed()
    B, L, H, K, V = 2, 7, 2, 3, 4
    g = lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s, dtype=torch.float64) + 1)  # noqa: E731
    gl = {"none": None, "constant": g(1, 1, H, 1), "scalar": g(B, L, H, 1), "vector": g(B, L, H, K)}[decay]
    leaves = [torch.randn(B, L, H, K, dtype=torch.float64), gl, g(B, L, H, V) if right else None,
              torch.randn(B, H, K, V, dtype=torch.float64)]
    leaves = [x.requires_grad_() if x is not None else None for x in leaves]

    def term(q, gl, rd, E):
        return entry_term(q, gl.expand(1, L, H, 1) if decay == "constant" else gl, rd, E, 0.7, reverse)

    assert torch.autograd.gradcheck(term, tuple(leaves))


@pytest.mark.parametrize("spans", [False, True], ids=["chunk_per_program", "spans"])
@pytest.mark.parametrize("decay", ["none", "constant", "scalar", "vector"])
def test_entry_term_triton_kernels(decay, spans, monkeypatch):
    """The entry term's kernels (ula/core/triton/entry.py, float32 under the interpreter) against the PyTorch form
    in float64: o + corr and the gradients of o, q, the left decay and the state; L spans several chunks and
    ends inside one, K and V are not powers of two (masks) and V spans two blocks. spans: several chunks per
    program (the last span shorter), and V over two blocks in the dq kernel too."""
    import ula.core.triton.entry as entry
    from ula.core.cp_entry import add_entry_term, entry_term
    fresh_seed()
    B, L, H, K, V = 2, 150, 2, 20, 80
    if spans:
        monkeypatch.setattr(entry, "_MIN_PROGRAMS", 1)
        L, V = 300, 150
    g = lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s) + 3)  # noqa: E731
    base = {"none": None, "constant": g(H), "scalar": g(B, L, H, 1), "vector": g(B, L, H, K)}[decay]
    xs = [torch.randn(B, L, H, V), torch.randn(B, L, H, K), base, torch.randn(B, H, K, V) * 0.3]
    dout = torch.randn(B, L, H, V)
    res = []
    for backend, dt in (("triton", torch.float32), ("torch", torch.float64)):
        leaves = [None if x is None else x.detach().to(dt).requires_grad_() for x in xs]
        o, q, gl, E = leaves
        glc = None if gl is None else (gl.view(1, 1, H, 1).expand(1, L, H, 1) if decay == "constant" else gl)
        if backend == "triton":
            out = add_entry_term(o, q, glc, None, E, 0.7, False, "triton")
        else:
            out = o + entry_term(q, glc, None, E, 0.7, False)
        (out * dout.to(dt)).sum().backward()
        res.append([out] + [x.grad for x in leaves if x is not None])
    # A constant decay's gradient is one float32 sum over B·L·K·V (~2e6) terms per head: its rounding reaches
    # ~2e-5 relative with some seeds, where every other tensor stays near 1e-6.
    tols = [1e-4 if decay == "constant" and i == 3 else 1e-5 for i in range(len(res[0]))]
    for got, want, tol in zip(*res, tols):
        assert got.dtype == torch.float32 and rel(got.double(), want) < tol


@pytest.mark.parametrize("backward", ["all", "state"])
@pytest.mark.parametrize("decay", ["none", "constant", "scalar"])
def test_entry_term_triton_kernels_with_column(decay, backward, monkeypatch):
    """A column beside E (mLSTMexp's normalizer, formed by the same kernels from the same reads of q, float32 both
    ways): o + corr and den + its term against the PyTorch form in float64, and the gradients of o, den, q, the left
    decay, E and the column (backward="state": the state's alone, as context parallelism asks); several chunks per
    program, L ending inside a chunk, K and V not powers of two, V over two blocks in the forward (the column in the
    first block's programs alone) and three in dE."""
    import ula.core.triton.entry as entry
    from ula.core.cp_entry import add_entry_term, entry_term
    seed = fresh_seed()
    monkeypatch.setattr(entry, "_MIN_PROGRAMS", 1)
    B, L, H, K, V = 2, 300, 2, 20, 150
    g = lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s) + 3)  # noqa: E731
    base = {"none": None, "constant": g(1, 1, H, 1).expand(1, L, H, 1), "scalar": g(B, L, H, 1)}[decay]
    xs = [torch.randn(B, L, H, V), torch.randn(B, L, H), torch.randn(B, L, H, K), base,
          torch.randn(B, H, K, V) * 0.3, torch.randn(B, H, K, 1) * 0.3]
    dout, dden = torch.randn(B, L, H, V), torch.randn(B, L, H)
    grads = {"all": [True] * 6, "state": [False, False, False, False, True, True]}[backward]
    res = []
    for backend, dt in (("triton", torch.float32), ("torch", torch.float64)):
        leaves = [None if x is None else x.detach().to(dt).requires_grad_(w) for x, w in zip(xs, grads)]
        o, den, q, gl, E, En = leaves
        if backend == "triton":  # one launch each way forms both terms
            seen = record_launches(monkeypatch, lambda kernel, w, cx, s: (kernel.fn.__name__, cx["COL"])
                                   if "entry" in kernel.fn.__name__ else None)
            out, dn = add_entry_term(o, q, gl, None, E, 0.7, False, "triton", column=(den, En))
        else:
            out, dn = o + entry_term(q, gl, None, E, 0.7, False), den + entry_term(q, gl, None, En, 0.7, False)[..., 0]
        ((out * dout.to(dt)).sum() + (dn * dden.to(dt)).sum()).backward()
        res.append([out, dn] + [x.grad for x in leaves if x is not None and x.requires_grad])
    kernels = ["_entry_fwd_kernel", "_entry_de_kernel"] + (["_entry_dq_kernel"] if backward == "all" else [])
    assert seen == [(k, True) for k in kernels]
    assert len(res[0]) == 2 + sum(w for x, w in zip(xs, grads) if x is not None)
    for got, want in zip(*res):
        assert got.dtype == torch.float32 and rel(got.double(), want) < 1e-5, seed


def test_entry_term_column_keeps_float32_precision_with_bfloat16_operands():
    """With bfloat16 matmul operands (emulated: each operand rounded as a GPU's dot rounds it) the column's terms
    still reach float32's precision, forward and dE (its three bfloat16 parts), where the values' terms show
    bfloat16's rounding of E and of the decayed dC: q is bfloat16 itself, as the kernels read it on a GPU."""
    import ula.core.triton.entry as entry
    from ula.core.cp_entry import entry_term
    from ula.core.triton.utils import DOT_BF16_EMULATED
    seed = fresh_seed()
    B, L, H, K, V = 1, 200, 2, 32, 32
    q = torch.randn(B, L, H, K).bfloat16().float()
    gl = torch.nn.functional.logsigmoid(torch.randn(B, L, H, 1) + 3)
    E, En = torch.randn(B, H, K, V), torch.randn(B, H, K)
    o, den, dc, dden = torch.randn(B, L, H, V), torch.randn(B, L, H), torch.randn(B, L, H, V), torch.randn(B, L, H)
    carry = entry.chunk_carry(gl, L)
    n_out = torch.full_like(den, float("nan"))
    out = entry.entry_forward(q, gl, E, o, 0.5, carry, dot=DOT_BF16_EMULATED, column=(En, den, n_out))
    dE, _, dEn = entry.entry_backward_e(q, gl, E, dc, 0.5, carry, True, False, dot=DOT_BF16_EMULATED,
                                        column=(En, dden))
    q64, gl64, E64, En64 = q.double(), gl.double(), E.double(), En.double().unsqueeze(-1)
    want_n = den.double() + entry_term(q64, gl64, None, En64, 0.5, False)[..., 0]
    assert rel(n_out.double(), want_n) < 1e-6, seed
    E64 = E64.requires_grad_()
    En64 = En64.requires_grad_()
    (entry_term(q64, gl64, None, E64, 0.5, False) * dc.double()).sum().backward()
    (entry_term(q64, gl64, None, En64, 0.5, False)[..., 0] * dden.double()).sum().backward()
    assert rel(dEn.double(), En64.grad[..., 0]) < 1e-6, seed
    # the values' terms do round (the test would not tell the column's parts from one bfloat16 operand otherwise)
    assert 1e-4 < rel(out.double(), o.double() + entry_term(q64, gl64, None, E.double(), 0.5, False)) < 2e-2
    assert 1e-4 < rel(dE.double(), E64.grad) < 2e-2


def test_entry_term_column_with_a_decay_per_feature_takes_the_pytorch_form(monkeypatch):
    """A column beside E reads q as loaded: with a decay per feature the PyTorch form forms both terms."""
    import ula.core.cp_entry as ce
    fresh_seed()
    B, L, H, K, V = 1, 70, 2, 16, 8
    o, q, E = torch.randn(B, L, H, V), torch.randn(B, L, H, K), torch.randn(B, H, K, V)
    den, En = torch.randn(B, L, H), torch.randn(B, H, K, 1)
    gl = torch.nn.functional.logsigmoid(torch.randn(B, L, H, K) + 3)
    monkeypatch.setattr(ce._EntryTermTriton, "apply", lambda *a: pytest.fail("the kernels were called"))
    got, got_n = ce.add_entry_term(o, q, gl, None, E, 0.5, False, "triton", column=(den, En))
    d = (q.double(), gl.double())
    assert rel(got, o + ce.entry_term(*d, None, E.double(), 0.5, False)) < 1e-6
    assert rel(got_n, den + ce.entry_term(*d, None, En.double(), 0.5, False)[..., 0]) < 1e-6


def test_entry_term_wide_keys_take_the_pytorch_form(monkeypatch):
    """K over 256 (the kernels' one tile of K) goes to the PyTorch form, whatever the backend asks."""
    import ula.core.cp_entry as ce
    fresh_seed()
    B, L, H, K, V = 1, 5, 1, 272, 4
    o, q, E = torch.randn(B, L, H, V), torch.randn(B, L, H, K), torch.randn(B, H, K, V)
    gl = torch.nn.functional.logsigmoid(torch.randn(B, L, H, 1) + 3)
    monkeypatch.setattr(ce._EntryTermTriton, "apply", lambda *a: pytest.fail("the kernels were called"))
    got = ce.add_entry_term(o, q, gl, None, E, 0.5, False, "triton")
    assert rel(got, o + ce.entry_term(q.double(), gl.double(), None, E.double(), 0.5, False)) < 1e-6


def test_entry_term_triton_float16_large_state():
    """float16 inputs: the kernels' matmuls take float32 operands, as the PyTorch form does, because a state can
    exceed float16's range (here |E| ~ 1e5 while the outputs stay O(1))."""
    from ula.core.cp_entry import add_entry_term, entry_term
    fresh_seed()
    B, L, H, K, V = 1, 70, 2, 16, 16
    gl = torch.nn.functional.logsigmoid(torch.randn(B, L, H, 1) + 3)
    o, q = torch.randn(B, L, H, V).half(), (torch.randn(B, L, H, K) * 1e-4).half()
    E = torch.randn(B, H, K, V) * 1e5
    got = add_entry_term(o, q, gl, None, E, 1.0, False, "triton")
    want = o.double() + entry_term(q.double(), gl.double(), None, E.double(), 1.0, False)
    assert got.dtype == torch.float16 and torch.isfinite(got).all() and rel(got, want) < 2e-3
