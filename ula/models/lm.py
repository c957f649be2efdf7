"""A Llama-style causal LM over any token mixer of `ula.layers`.

    h = embed(ids);  for each block:  h = h + mixer(RMSNorm(h));  h = h + SwiGLU(RMSNorm(h))
    logits = softcap(lm_head(RMSNorm(h)))

`forward(input_ids, cache=None)` runs the chunk path over the given tokens, continuing from `cache`
(a `StateCache`, one mixer state per block) and returning the new one; a single token with a cache
takes the recurrent `step` path. `generate` prefills with the chunk path and then decodes one recurrent
step per token: for the linear mixers the cache has a fixed size, whatever the number of tokens."""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import MIXERS, RMSNorm, build_mixer, softcap
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


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _tensors(y)


class StateCache:
    """One mixer state per block plus the number of tokens seen. For the linear mixers each state has a
    size fixed by the model (not by the number of tokens); softmax attention keeps its growing KV cache."""

    def __init__(self, states, seen_tokens=0):
        self.states = list(states)
        self.seen_tokens = seen_tokens

    def tensors(self):
        return list(_tensors(self.states))

    def numel(self):
        return sum(t.numel() for t in self.tensors())

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def __len__(self):
        return len(self.states)

    def __repr__(self):
        return f"StateCache({len(self.states)} layers, {self.seen_tokens} tokens seen, {self.numel()} numbers)"


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, greedy=False, generator=None):
    """Next tokens [B] from logits [B, V]: argmax if greedy (or temperature 0), else a draw from
    softmax(logits / temperature) restricted to the top_k tokens and to the smallest set whose
    probability reaches top_p (nucleus)."""
    if greedy or temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
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
        if cache is not None and input_ids.shape[1] == 1 and cu_seqlens is None:
            logits, cache = self.step(input_ids[:, 0], cache)
            return logits.unsqueeze(1), cache
        states = [None] * len(self.blocks) if cache is None else cache.states
        h = self.embed(input_ids)
        new = []
        for block, s in zip(self.blocks, states):
            h, s = block(h, s, cu_seqlens)
            new.append(s)
        seen = (0 if cache is None else cache.seen_tokens) + input_ids.shape[1]
        return self._logits(h), StateCache(new, seen)

    def step(self, token_ids, cache=None):
        """One token per row, token_ids [B] -> (logits [B, vocab], StateCache)."""
        states = [None] * len(self.blocks) if cache is None else cache.states
        h = self.embed(token_ids)
        new = []
        for block, s in zip(self.blocks, states):
            h, s = block.step(h, s)
            new.append(s)
        seen = (0 if cache is None else cache.seen_tokens) + 1
        return self._logits(h), StateCache(new, seen)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, greedy=False,
                 generator=None, eos_token_id=None, return_cache=False):
        """Prefill input_ids [B, T] with the chunk path, then decode max_new_tokens tokens one recurrent
        step each. Returns [B, T + new] (and the final StateCache with return_cache=True). Rows that
        produced eos_token_id keep producing it; decoding stops early when every row has."""
        logits, cache = self(input_ids)
        last = logits[:, -1]
        out = [input_ids]
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for i in range(max_new_tokens):
            tok = sample_next(last, temperature, top_k, top_p, greedy, generator)
            if eos_token_id is not None:
                tok = torch.where(done, torch.full_like(tok, eos_token_id), tok)
                done = done | (tok == eos_token_id)
            out.append(tok[:, None])
            if i + 1 == max_new_tokens or (eos_token_id is not None and bool(done.all())):
                break
            last, cache = self.step(tok, cache)
        ids = torch.cat(out, 1)
        return (ids, cache) if return_cache else ids

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
