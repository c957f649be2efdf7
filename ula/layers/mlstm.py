"""The mLSTM layer (paper 003, §2.1 Eq. 1-5 and §4; architecture of App. E.2).

Per head, with d_hv = d_v / H and d_qk = d_hv / 2 (App. E.2):
    q, k, v = W_{q,k,v} x + b_{q,k,v}
    ĩ, f̃ = softcap_15(w_{i,f}ᵀ x + b_{i,f})          (gate soft-capping c · tanh(x / c), c = 15)
    h̃ = mLSTM cell (exp: Eq. 1-4 with max and normalizer states; sig: Eq. 19-20), q scaled by d_qk^(-1/2)
    o = σ(W_o x + b_o),   h = o ⊙ NORM(h̃)   (NORM: LayerNorm per head, eps 1e-6)
    y = h W_out
Input-gate biases start at −10 (§4.2, App. E.2). Forget-gate biases start spread over [3, 6] per head
(not fixed by the paper; a slowly-forgetting start). variant "exp" or "sig"."""
import torch
import torch.nn as nn

from ..ops import mlstm, mlstm_step
from ._base import Mixer, check_divisible, head_norm, merge_heads, softcap, split_heads, wide


class MLSTMLayer(Mixer):
    context_parallel = True  # ula.ops.mlstm takes a cp_group

    def __init__(self, d_model, n_heads=4, *, variant="exp", expand_v=1.0, qk_ratio=0.5, gate_softcap=15.0,
                 igate_bias_init=-10.0, fgate_bias_init=(3.0, 6.0), norm="layernorm", norm_eps=1e-6, eps=1e-6,
                 chunk_size=None, backend="auto"):
        super().__init__(d_model, n_heads, chunk_size, backend)
        if variant not in ("exp", "sig"):
            raise ValueError(f"MLSTMLayer: variant must be 'exp' or 'sig', got {variant!r}")
        self.d_model, self.n_heads, self.variant = d_model, n_heads, variant
        self.d_v = int(d_model * expand_v)
        check_divisible("d_v", self.d_v, n_heads, f"int(d_model · expand_v) = int({d_model} · {expand_v})")
        self.d_qk = int(self.d_v * qk_ratio)
        check_divisible("d_qk", self.d_qk, n_heads, f"int(d_v · qk_ratio) = int({self.d_v} · {qk_ratio})")
        self.gate_softcap, self.eps, self.chunk_size, self.backend = gate_softcap, eps, chunk_size, backend
        self.q_proj = nn.Linear(d_model, self.d_qk, bias=True)
        self.k_proj = nn.Linear(d_model, self.d_qk, bias=True)
        self.v_proj = nn.Linear(d_model, self.d_v, bias=True)
        self.i_proj = nn.Linear(d_model, n_heads, bias=True)
        self.f_proj = nn.Linear(d_model, n_heads, bias=True)
        self.og_proj = nn.Linear(d_model, self.d_v, bias=True)
        self.h_norm = head_norm(norm, self.d_v // n_heads, norm_eps)
        self.o_proj = nn.Linear(self.d_v, d_model, bias=False)
        self.igate_bias_init, self.fgate_bias_init = igate_bias_init, fgate_bias_init
        self.reset_gate_biases()

    @torch.no_grad()
    def reset_gate_biases(self):
        self.i_proj.bias.fill_(self.igate_bias_init)
        lo, hi = self.fgate_bias_init
        self.f_proj.bias.copy_(torch.linspace(lo, hi, self.n_heads))

    def _inputs(self, x):
        H = self.n_heads
        q = split_heads(self.q_proj(x), H)
        k = split_heads(self.k_proj(x), H)
        v = split_heads(self.v_proj(x), H)
        i = softcap(wide(self.i_proj(x)), self.gate_softcap)
        f = softcap(wide(self.f_proj(x)), self.gate_softcap)
        return q, k, v, i, f

    def _output(self, h, x):
        h = merge_heads(self.h_norm(h.to(x.dtype)))
        return self.o_proj(torch.sigmoid(self.og_proj(x)) * h)

    def forward(self, x, state=None, cu_seqlens=None):
        q, k, v, i, f = self._inputs(x)
        h, S = mlstm(q, k, v, i, f, self.variant, eps=self.eps, initial_state=state, **self._kw(cu_seqlens))
        return self._output(h, x), S

    def step(self, x, state=None):
        q, k, v, i, f = self._inputs(x)
        h, S = mlstm_step(q, k, v, i, f, state, self.variant, eps=self.eps)
        return self._output(h, x), S
