"""Decoding with CUDA graphs: one step of a `CausalLM` (embedding -> every layer's step -> logits) captured
once and replayed per token.

At batch 1 an eager decoding step is bound by kernel launches (hundreds of small kernels per token, each
launched from Python); a replayed graph launches them all at once. The step runs on a `StaticStateCache`
(buffers updated in place, the position on the device), so the replayed kernels read and write the same
memory every time. Where a state depends on the length (softmax attention's KV cache), one graph is captured
per bound of the cache (`StaticStateCache.bounds`) and each step replays the one covering its position.

    dec = GraphedDecoder(model, cache, max_len)   # cache: a StateCache from the prefill (left as it is)
    logits = dec(tokens)                          # [B] -> [B, vocab]; valid until the next call

`capture=False` runs the same static steps eagerly (no CUDA needed: what the CPU tests check)."""
import torch

from ..layers._base import state_tensors


class GraphedDecoder:
    """Static decoding of `model` from a copy of `cache` (a StateCache), for up to max_len tokens in all.
    `cache` (the attribute) is the StaticStateCache the steps update. Captures on construction (capture=True,
    CUDA only); `load` restarts from another prefill without capturing again."""

    def __init__(self, model, cache, max_len, *, capture=True, min_bound=256, warmup=2):
        self.model = model
        self.cache = model.static_cache(cache, max_len, min_bound)
        first = state_tensors(self.cache.states)[0]
        self.tokens = torch.zeros(first.shape[0], dtype=torch.long, device=self.cache.position.device)
        self.graphs = {}
        if capture:
            if self.tokens.device.type != "cuda":
                raise RuntimeError(f"CUDA graphs need a CUDA device, the model is on {self.tokens.device}")
            self._capture(warmup)
            model.load_static_cache(self.cache, cache)   # the warm-up and capture wrote into the buffers

    @property
    def captured(self):
        return bool(self.graphs)

    @torch.no_grad()
    def _capture(self, warmup):
        """One graph per bound (one in all where no state depends on the length), sharing one memory pool:
        the graphs run one at a time and only their logits outlive a replay."""
        static, model = self.cache, self.model
        bounds = static.bounds if static.bounds is not None else [None]
        side, current = torch.cuda.Stream(), torch.cuda.current_stream()
        pool = None
        for b in bounds:
            static.position.zero_()   # warm-up steps write at positions 0, 1, ...: always inside the buffers
            side.wait_stream(current)
            with torch.cuda.stream(side):   # first calls (cuBLAS handles, workspaces) outside the capture
                for _ in range(warmup):
                    model.step_static(self.tokens, static, b)
            current.wait_stream(side)
            static.position.zero_()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                logits = model.step_static(self.tokens, static, b)
            pool = g.pool()
            self.graphs[b] = (g, logits)
        torch.cuda.synchronize()

    @torch.no_grad()
    def load(self, cache):
        """Restart from `cache` (a StateCache of the same batch, with fewer than max_len tokens)."""
        self.model.load_static_cache(self.cache, cache)

    @torch.no_grad()
    def __call__(self, tokens):
        """tokens [B] -> logits [B, vocab] (a buffer the next call overwrites), the cache one token further."""
        static = self.cache
        b = static.bound_for(static.seen_tokens + 1)
        if self.graphs:
            g, logits = self.graphs[b]
            self.tokens.copy_(tokens)
            g.replay()
        else:
            logits = self.model.step_static(tokens, static, b)
        static.seen_tokens += 1
        return logits
