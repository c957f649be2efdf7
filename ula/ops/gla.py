"""Gated Linear Attention (paper 002): a per-key-feature (vector) forget gate.

    S_t = Diag(exp g_t) S_{t-1} + k_t v_tᵀ,      o_t = scale · S_tᵀ q_t

`g` is the log forget gate [B, T, H, K] (<= 0), e.g. logsigmoid(x W) / τ as in the GLA layer (§4.4).
One call of the core with a vector left decay, at precision "accurate" by default: with bfloat16 inputs its output and
every gradient are then at or below fla chunk_gla's error against float64, at 3.25 ms against "fast"'s 2.98 and fla's
3.44 in the same run (H100, B2 T8192 H16 K=V=128: benchmarks/RESULTS.md "GPU, session 13")."""
from ..core import linear_attention
from ..core.context_parallel import raised_everywhere
from ..core.precision import parse
from ._checks import check_float, check_sequence, check_step_qkv, check_step_state
from ._common import _step, decay_dtype


def gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        chunk_size=None, backend="auto", cp_group=None, precision=None):
    """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] log forget gate (<= 0).
    precision: the core's matmul precision for half-precision inputs ("fast", "accurate", parts; see
    ula/core/precision.py); None: GLA's measured default, "accurate"; `ula.set_precision` overrides it.
    cp_group: context parallelism over a torch.distributed group (see ula/core/context_parallel.py).
    scale defaults to K ** -0.5. States [B, H, K, V] float32 ([N, H, K, V] with cu_seqlens).
    Returns (o [B, T, H, V], final state or None).
    initial_state, output_final_state, cu_seqlens, chunk_size, backend: as in `ula.linear_attention`."""
    with raised_everywhere(cp_group, "gla"):  # with cp_group: a check failing here raises on every rank
        check_sequence(q, k, v, None if cp_group is not None else cu_seqlens, chunk_size, backend, scale)
        check_float("gla", "g", g, q.shape, "[B, T, H, K] (log forget gate, the shape of q)", device=q.device,
                    log_gate=True)
        parse(precision, "gla: precision")
    return linear_attention(q, k, v, g.to(decay_dtype(q)), scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                            chunk_size=chunk_size, backend=backend, cp_group=cp_group,
                            precision="accurate" if precision is None else precision)


def gla_step(q, k, v, g, state=None, *, scale=None):
    """One decoding step: q, k, g [B, H, K], v [B, H, V], state [B, H, K, V] or None.
    Returns (o [B, H, V], new state)."""
    check_step_qkv("gla_step", q, k, v, scale=scale)
    check_float("gla_step", "g", g, q.shape, "[B, H, K] (log forget gate, the shape of q)", device=q.device)
    check_step_state("gla_step", state, q.shape + v.shape[-1:], device=q.device)
    return _step(q, k, v, g, None, state, scale)
