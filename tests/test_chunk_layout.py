"""The chunk layout shared by the kernels and the decay gradient (ula/core/chunk_layout.py) against the chunks listed
step by step from cu_seqlens: every chunk starts at a multiple of C from its sequence's first step, ends at C steps or
the sequence's end, and is inner where its sequence goes on; empty sequences have no chunks."""
import pytest
import torch

from ula.core.chunk_layout import chunk_bounds, make_layout


def listed(bounds, C):
    rows = []
    for n, (s, e) in enumerate(zip(bounds, bounds[1:])):
        for c0 in range(s, e, C):
            rows.append((n, c0, min(c0 + C, e), c0 + C < e))
    return rows


@pytest.mark.parametrize("lens,C", [([17, 5, 40], 16), ([0, 33, 0, 64, 1], 16), ([200], 64), ([3, 0], 64)])
def test_packed_layout_matches_listed_chunks(lens, C):
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    want = listed(cu.tolist(), C)
    T = int(cu[-1])
    lay = make_layout(1, T, C, cu, cu.device)
    assert (lay.n, lay.N, lay.varlen) == (len(want), len(lens), True)
    assert lay.chunk_seq.tolist() == [r[0] for r in want]
    assert lay.chunk_start.tolist() == [r[1] for r in want]
    firsts = [sum(1 for r in want if r[0] < n) for n in range(len(lens) + 1)]
    assert lay.chunk_offset.tolist() == firsts
    b = chunk_bounds(T, C, cu, cu.device)
    assert b.starts.tolist() == [r[1] for r in want]
    assert b.ends.tolist() == [r[2] for r in want]
    assert b.inner.tolist() == [r[3] for r in want]


def test_unpacked_bounds():
    b = chunk_bounds(37, 16, None, "cpu")
    assert (b.starts.tolist(), b.ends.tolist(), b.inner.tolist()) == ([0, 16, 32], [16, 32, 37], [True, True, False])
    lay = make_layout(3, 37, 16, None, "cpu")
    assert (lay.n, lay.N, lay.varlen) == (3, 3, False)
