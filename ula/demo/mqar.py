"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"), generated on the fly.

A sequence holds `num_kv` key-value pairs, then the keys again as queries in a random order, each
followed by its value:

    k_1 v_1 k_2 v_2 ... k_N v_N   q_1 a_1 q_2 a_2 ... q_N a_N        (T = 4 N, the shortest)

With a longer `seq_len` T, the N query-answer pairs sit at random even offsets of the T - 2N positions
after the context, and the others hold the filler token 0 (as in Zoology).

Keys are drawn without replacement from the token ids [1, vocab/2), values with replacement from
[vocab/2, vocab). The model reads the whole sequence causally; it is scored only where the input is
a query: the target there is the value the query's key was paired with (-100 elsewhere). Accuracy is
the fraction of queries answered exactly (argmax).

Two options, off by default here (issue 6; `ula demo` uses prefix = 32, see DemoConfig and the probes in
benchmarks/demo_cpu.txt):
- noise=True: the non-query positions after the context hold random tokens of the whole vocabulary instead
  of the filler 0 (Zoology's random_non_queries), except this sequence's keys (drawn ones become 0): with
  Zoology's vocabulary of 8192 such a collision is rare, with 64 it would make recall ambiguous.
- prefix=P: the first P of the T positions hold random tokens of the whole vocabulary (keys included), the
  MQAR sequence of length T - P follows (unchanged, its queries still score only its own pairs). Not part
  of Zoology's MQAR, whose sequences start with the pairs: the prefix plays the text before them (as the
  previous document in a packed batch), a past that a decaying state can forget and a non-decaying one
  keeps; a key of the prefix followed by some other token is a stale binding of that key."""
import torch

IGNORE = -100


def mqar_batch(batch_size, num_kv, vocab_size, seq_len=None, generator=None, device="cpu", noise=False, prefix=0):
    """(inputs [B, T] int64, targets [B, T] int64 with IGNORE off the query positions); T = seq_len,
    default 4 · num_kv. noise, prefix: see the module's docstring (off by default)."""
    half = vocab_size // 2
    B, N = batch_size, num_kv
    T = 4 * N if seq_len is None else seq_len
    if N < 1 or N > half - 1:
        raise ValueError(f"num_kv = {N} needs 1 <= num_kv and vocab_size >= {2 * (N + 1)}, got {vocab_size}")
    if T - prefix < 4 * N or T % 2 or prefix < 0 or prefix % 2:
        raise ValueError(f"seq_len = {T} must be even and at least 4 * num_kv = {4 * N}"
                         + (f" plus the prefix {prefix} (even, >= 0)" if prefix else ""))
    keys = torch.argsort(torch.rand(B, half - 1, generator=generator), -1)[:, :N] + 1
    values = torch.randint(half, vocab_size, (B, N), generator=generator)
    order = torch.argsort(torch.rand(B, N, generator=generator), -1)
    qk, qv = keys.gather(1, order), values.gather(1, order)
    T = T - prefix                                             # the MQAR part after the prefix
    slots = (T - 2 * N) // 2                                   # query slots after the context
    pick = torch.argsort(torch.rand(B, slots, generator=generator), -1)[:, :N].sort(-1).values
    pos = 2 * N + 2 * pick                                     # [B, N] offsets of the queries
    inputs = torch.zeros(B, T, dtype=torch.long)
    if noise:                                                  # Zoology's random_non_queries
        fill = torch.randint(0, vocab_size, (B, T - 2 * N), generator=generator)
        fill[(fill[:, :, None] == keys[:, None, :]).any(-1)] = 0
        inputs[:, 2 * N:] = fill
    inputs[:, :2 * N] = torch.stack([keys, values], -1).flatten(1)
    inputs.scatter_(1, pos, qk)
    inputs.scatter_(1, pos + 1, qv)
    targets = torch.full_like(inputs, IGNORE)
    targets.scatter_(1, pos, qv)                                # at each query, predict its value
    if prefix:
        pre = torch.randint(0, vocab_size, (B, prefix), generator=generator)
        inputs = torch.cat([pre, inputs], 1)
        targets = torch.cat([torch.full_like(pre, IGNORE), targets], 1)
    return inputs.to(device), targets.to(device)


def accuracy(logits, targets):
    """(number of queries answered exactly, number of queries)."""
    mask = targets != IGNORE
    return int((logits.argmax(-1)[mask] == targets[mask]).sum()), int(mask.sum())
