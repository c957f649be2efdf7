"""Session 35's finding reduced to plain PyTorch, without ula (results/graph_trees_cu_h100_session35.txt): under
torch.compile(mode="reduce-overhead"), an op tagged cudagraph_unsafe whose input a CUDA graph before it also reads
may get the graphs' copy of that input: the same tensor object at every replay, its memory rewritten with each
call's values, its version counter unchanged. A cache keyed by (tensor, version), as ula.core.cu_cache was, then
returns an earlier call's values (ula now reads afresh there: ula/core/custom_ops.py). Prints, per call, what the
unsafe op saw: the tensor's id, version and values, against the caller's tensor.
Run: python3 benchmarks/gpu_graph_trees_version_repro.py"""
import torch

seen = []


@torch.library.custom_op("repro::peek", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def peek(x: torch.Tensor) -> torch.Tensor:
    seen.append((id(x), x._version, x.tolist()))
    return x.clone()


@peek.register_fake
def _(x):
    return torch.empty_like(x)


def step(x):
    return peek(x) + x * 2  # x read inside a graph as well as by the unsafe op


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    ids = set()
    for vals in ([1, 2, 3], [1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]):
        x = torch.tensor(vals, device="cuda", dtype=torch.float32)
        seen.clear()
        out = compiled(x)
        right = torch.equal(out, x * 3)
        print(f"call with {vals} (id {id(x)}): the unsafe op saw {seen}; output right: {right}", flush=True)
        ids.update(i for i, _, _ in seen)
    print(f"distinct tensors the unsafe op saw over 5 calls: {len(ids)}", flush=True)
