"""A Llama-style causal LM over any token mixer of `ula.layers`.

    h = embed(ids);  for each block:  h = h + mixer(RMSNorm(h));  h = h + SwiGLU(RMSNorm(h))
    logits = softcap(lm_head(RMSNorm(h)))

`forward(input_ids, cache=None)` runs the chunk path over the given tokens, continuing from `cache`
(a `StateCache`, one mixer state per block) and returning the new one; a single token with a cache
takes the recurrent `step` path. `generate` prefills with the chunk path and then decodes one recurrent
step per token: for the linear mixers the cache has a fixed size, whatever the number of tokens.

Static decoding: `static_cache` turns a cache into a `StaticStateCache`, preallocated buffers (softmax
attention: a KV cache of a maximum length) that `step` updates in place, the position kept on the device.
One step, embedding -> every layer's step -> logits, then neither synchronizes with the host nor allocates
what outlives it, so `generate(..., cuda_graph=True)` (the default on CUDA) captures it once in a CUDA graph
(`ula.models.cuda_graph`) and replays it per token: eager decoding at batch 1 is bound by kernel launches."""
import json
import math
import os
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import MIXERS, RMSNorm, build_mixer, softcap
from ..layers._base import state_tensors
from .config import LMConfig

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


class SwiGLU(nn.Module):
    """(Swish(x W1) ⊙ x W2) W3."""

    def __init__(self, d_model, hidden):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.mixer_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = build_mixer(cfg.mixer, cfg.d_model, cfg.n_heads, **cfg.mixer_kwargs)
        self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_hidden)

    def forward(self, h, state=None, cu_seqlens=None):
        y, state = self.mixer(self.mixer_norm(h), state=state, cu_seqlens=cu_seqlens)
        h = h + y
        return h + self.mlp(self.mlp_norm(h)), state

    def step(self, h, state=None):
        y, state = self.mixer.step(self.mixer_norm(h), state)
        h = h + y
        return h + self.mlp(self.mlp_norm(h)), state

    def step_static(self, h, buffers, pos, bound=None):
        h = h + self.mixer.step_static(self.mixer_norm(h), buffers, pos, bound)
        return h + self.mlp(self.mlp_norm(h))


class StateCache:
    """One mixer state per block plus the number of tokens seen. For the linear mixers each state has a
    size fixed by the model (not by the number of tokens); softmax attention keeps its growing KV cache."""
    # asked by transformers' generate (5.2x) of a cache passed in: no torch.compile of the steps, and no slicing of
    # the prompt by generate (the wrapper's prepare_inputs_for_generation drops the seen tokens itself)
    is_compileable = False

    @property
    def is_linear(self):
        return [True] * len(self.states)

    def get_seq_length(self, layer_idx=0):  # what transformers' generate (5.1x) asks of a cache passed in
        return self.seen_tokens

    def __init__(self, states, seen_tokens=0):
        self.states = list(states)
        self.seen_tokens = seen_tokens

    def tensors(self):
        return state_tensors(self.states)

    def numel(self):
        return sum(t.numel() for t in self.tensors())

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def __len__(self):
        return len(self.states)

    def __repr__(self):
        return f"StateCache({len(self.states)} layers, {self.seen_tokens} tokens seen, {self.numel()} numbers)"


class StaticStateCache(StateCache):
    """Preallocated mixer states (`Mixer.static_state`), updated in place by each step, for up to max_len
    tokens in all. `position` (int64 [1], on the device) counts the tokens seen, as `seen_tokens` does on the
    host. Where a mixer's state depends on the length (uses_length: softmax attention's KV cache), a step
    reads its buffers up to a bound: the smallest of `bounds` (powers of two from `min_bound`, then max_len)
    that covers the position, so attention at a short context reads a short prefix and one CUDA graph per
    bound serves every position. Made by `CausalLM.static_cache`."""

    def __init__(self, states, seen_tokens, position, max_len, bounds=None):
        super().__init__(states, seen_tokens)
        self.position, self.max_len, self.bounds = position, max_len, bounds

    def bound_for(self, n):
        """The bound of a step that makes the context n tokens long (None: no state depends on the length)."""
        if n > self.max_len:
            raise ValueError(f"the static cache holds {self.max_len} tokens; a step to {n} does not fit "
                             "(make it with a larger max_len)")
        if self.bounds is None:
            return None
        return next(b for b in self.bounds if b >= n)

    def __repr__(self):
        return (f"StaticStateCache({len(self.states)} layers, {self.seen_tokens} of {self.max_len} tokens, "
                f"{self.numel()} numbers)")


def _round_up(n, m):
    return -(-n // m) * m


def _check_sampling(temperature, top_k, top_p):
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy); got {temperature!r}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 1, or 0 / None for no top-k cut; got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], or None for no nucleus cut; got {top_p!r}")


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, greedy=False, generator=None):
    """Next tokens [B] from logits [B, V]: argmax if greedy (or temperature 0), else a draw from
    softmax(logits / temperature) restricted to the top_k tokens and to the smallest set whose
    probability reaches top_p (nucleus). top_k None or 0: no top-k cut (as `ula generate --top-k 0`);
    a negative top_k, a negative temperature or a top_p outside (0, 1] raises ValueError."""
    _check_sampling(temperature, top_k, top_p)
    if greedy or temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, -1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p          # tokens after the nucleus is already full
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class CausalLM(nn.Module):
    def __init__(self, config: LMConfig):
        super().__init__()
        if config.mixer not in MIXERS:
            raise ValueError(f"unknown mixer {config.mixer!r}; choose one of {sorted(MIXERS)}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @torch.no_grad()
    def reset_parameters(self):
        std = self.config.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)
        for m in self.modules():
            if m is not self and hasattr(m, "reset_gate_biases"):
                m.reset_gate_biases()

    def _logits(self, h):
        return softcap(self.lm_head(self.norm(h)), self.config.logit_softcap)

    def forward(self, input_ids, cache=None, cu_seqlens=None):
        """input_ids [B, T] -> (logits [B, T, vocab], StateCache). With a cache, continues from it
        (one token: the recurrent step; more: the chunk path from the cached states)."""
        if cache is not None and input_ids.shape[1] == 1 and cu_seqlens is None and not self._context_parallel():
            logits, cache = self.step(input_ids[:, 0], cache)
            return logits.unsqueeze(1), cache
        if isinstance(cache, StaticStateCache):   # continues token by token, in place
            if cu_seqlens is not None:
                raise ValueError("a StaticStateCache cannot be combined with cu_seqlens")
            if self._context_parallel():
                raise ValueError("a StaticStateCache steps token by token, which context parallelism cannot: "
                                 "pass a StateCache (or none), or turn it off with set_cp_group(model, None)")
            return torch.stack([self.step(t, cache)[0] for t in input_ids.unbind(1)], 1), cache
        states = [None] * len(self.blocks) if cache is None else cache.states
        h = self.embed(input_ids)
        new = []
        for block, s in zip(self.blocks, states):
            h, s = block(h, s, cu_seqlens)
            new.append(s)
        seen = (0 if cache is None else cache.seen_tokens) + input_ids.shape[1]
        return self._logits(h), StateCache(new, seen)

    def _context_parallel(self):
        """Whether a mixer runs with a cp_group: a one-token slice then takes the chunk path with the others (the
        recurrent step would neither join their collectives nor get the earlier ranks' state)."""
        return any(b.mixer.cp_group is not None for b in self.blocks)  # per block, not every module: a decoding path

    def step(self, token_ids, cache=None):
        """One token per row, token_ids [B] -> (logits [B, vocab], StateCache). A StaticStateCache is
        updated in place (and returned)."""
        if isinstance(cache, StaticStateCache):
            logits = self.step_static(token_ids, cache, cache.bound_for(cache.seen_tokens + 1))
            cache.seen_tokens += 1
            return logits, cache
        states = [None] * len(self.blocks) if cache is None else cache.states
        h = self.embed(token_ids)
        new = []
        for block, s in zip(self.blocks, states):
            h, s = block.step(h, s)
            new.append(s)
        seen = (0 if cache is None else cache.seen_tokens) + 1
        return self._logits(h), StateCache(new, seen)

    # ---- static decoding ----------------------------------------------------------------------------------
    @torch.no_grad()
    def static_cache(self, cache, max_len, min_bound=256):
        """A StaticStateCache for up to max_len tokens in all (rounded up to a multiple of 64), holding a copy
        of `cache` (a StateCache from forward or step; it is left as it is). min_bound: the first bound of a
        length-dependent state (see StaticStateCache)."""
        if isinstance(cache, StaticStateCache):
            raise TypeError("static_cache takes a StateCache (from forward or step), got a StaticStateCache")
        if cache.seen_tokens >= max_len:
            raise ValueError(f"max_len {max_len} leaves no room after the {cache.seen_tokens} tokens cached")
        max_len = _round_up(max_len, 64)
        states = [b.mixer.static_state(s, max_len) for b, s in zip(self.blocks, cache.states)]
        position = torch.full((1,), cache.seen_tokens, dtype=torch.long, device=self.embed.weight.device)
        bounds = None
        if any(b.mixer.uses_length for b in self.blocks):
            bounds, b = [], max(1, min_bound)
            while b < max_len:
                bounds.append(b)
                b *= 2
            bounds.append(max_len)
        return StaticStateCache(states, cache.seen_tokens, position, max_len, bounds)

    @torch.no_grad()
    def load_static_cache(self, static, cache):
        """Copies `cache` (a StateCache) into the buffers of `static`, in place: decoding restarts from it."""
        if cache.seen_tokens >= static.max_len:
            raise ValueError(f"{cache.seen_tokens} cached tokens leave no room in a static cache of {static.max_len}")
        for b, buf, s in zip(self.blocks, static.states, cache.states):
            b.mixer.load_static_state(buf, s)
        static.position.fill_(cache.seen_tokens)
        static.seen_tokens = cache.seen_tokens

    def step_static(self, token_ids, static, bound=None):
        """One token per row, token_ids [B] -> logits [B, vocab], from a StaticStateCache updated in place
        (its device position advances; its seen_tokens, on the host, is the caller's to advance). No host
        synchronization: what ula.models.cuda_graph captures."""
        h = self.embed(token_ids)
        for block, buf in zip(self.blocks, static.states):
            h = block.step_static(h, buf, static.position, bound)
        static.position.add_(1)
        return self._logits(h)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False,
                 generator=None, eos_token_id=None, return_cache=False, cuda_graph=None):
        """Prefill input_ids [B, T] with the chunk path, then decode max_new_tokens tokens one recurrent
        step each. Returns [B, T + new] (and the final cache with return_cache=True). Rows that
        produced eos_token_id keep producing it; decoding stops early when every row has.
        cuda_graph (default: True on CUDA, False elsewhere): decode from a StaticStateCache of T + new
        tokens, one CUDA-graph replay per token (the same steps; the returned cache is then the static
        one). Where CUDA graphs cannot be used (no CUDA device, or the capture fails), a warning says why
        and decoding goes on eagerly. temperature, top_k, top_p, greedy, generator: as in `sample_next`
        (top_k None or 0: no top-k cut)."""
        _check_sampling(temperature, top_k, top_p)   # before the prefill, not after it
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(f"generate: input_ids must be [B, T] with a prompt of T >= 1 tokens, "
                             f"got shape {tuple(input_ids.shape)}")
        logits, cache = self(input_ids)
        last = logits[:, -1]
        out = [input_ids]
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        graph = None
        if cuda_graph is None:
            cuda_graph = input_ids.device.type == "cuda"
        if cuda_graph and max_new_tokens > 1:
            graph = self._graph_or_warn(cache, input_ids.shape[1] + max_new_tokens - 1)
        for i in range(max_new_tokens):
            tok = sample_next(last, temperature, top_k, top_p, greedy, generator)
            if eos_token_id is not None:
                tok = torch.where(done, torch.full_like(tok, eos_token_id), tok)
                done = done | (tok == eos_token_id)
            out.append(tok[:, None])
            if i + 1 == max_new_tokens or (eos_token_id is not None and bool(done.all())):
                break
            if graph is not None:
                last = graph(tok)
            else:
                last, cache = self.step(tok, cache)
        ids = torch.cat(out, 1)
        if graph is not None:
            cache = graph.cache
        return (ids, cache) if return_cache else ids

    def _graph_or_warn(self, cache, max_len):
        """A captured GraphedDecoder over a static copy of cache, or None (with a warning) where it cannot be."""
        from .cuda_graph import GraphedDecoder
        device = self.embed.weight.device
        if device.type != "cuda":
            warnings.warn(f"generate(cuda_graph=True): CUDA graphs need a CUDA device, the model is on {device}; "
                          "decoding eagerly", RuntimeWarning, stacklevel=3)
            return None
        try:
            return GraphedDecoder(self, cache, max_len)
        except Exception as e:  # capture can fail on an op that syncs with the host, or on memory
            warnings.warn(f"generate(cuda_graph=True): capturing the decoding step in a CUDA graph failed "
                          f"({type(e).__name__}: {str(e)[:300]}); decoding eagerly", RuntimeWarning, stacklevel=3)
            return None

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    # ---- save / load -------------------------------------------------------------------------------
    def save_pretrained(self, directory):
        """Writes config.json and model.safetensors (the tied LM head is stored once, as the embedding)."""
        from safetensors.torch import save_file
        os.makedirs(directory, exist_ok=True)
        self.config.save(os.path.join(directory, CONFIG_NAME))
        sd = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.config.tie_embeddings:
            sd.pop("lm_head.weight", None)
        save_file(sd, os.path.join(directory, WEIGHTS_NAME), metadata={"format": "pt", "library": "ula"})

    @classmethod
    def from_pretrained(cls, directory, map_location="cpu", dtype=None):
        from safetensors.torch import load_file
        with open(os.path.join(directory, CONFIG_NAME)) as f:
            config = LMConfig.from_dict(json.load(f))
        model = cls(config)
        sd = load_file(os.path.join(directory, WEIGHTS_NAME), device=str(map_location))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if config.tie_embeddings:
            missing = [m for m in missing if m != "lm_head.weight"]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint in {directory} does not fit the config: missing {missing}, "
                               f"unexpected {unexpected}")
        model = model.to(map_location)
        return model if dtype is None else model.to(dtype)
