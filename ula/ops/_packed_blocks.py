"""Packed sequences cut in blocks of BT steps, numbered flat for a grid of one program per block: without varlen B
sequences of cdiv(T, BT) blocks each; with cu_seqlens each sequence's max(1, cdiv(L, BT)) blocks in a run, after those
of the sequences before it. A program finds its block's sequence from cu_seqlens on the device (no layout tensors,
no host read of cu_seqlens, so the launches stay inside CUDA graphs). Used by mLSTMexp's gate scan
(ula/ops/_mlstm_gate_kernels.py) and ABC's cumulative softmax (ula/ops/_abc_softmax_kernels.py)."""
import triton
import triton.language as tl

from ..core.triton.utils import INTERPRET, cdiv

_BIG = tl.constexpr(2147483647)  # int32 max: "no block"


@triton.jit
def _span(n, cu, T, VARLEN: tl.constexpr):
    """First row (in [B * T]) and length of sequence n."""
    if VARLEN:
        bos = tl.load(cu + n).to(tl.int64)
        return bos, (tl.load(cu + n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        return n.to(tl.int64) * T, T


@triton.jit
def _find(p, cu, N, BT: tl.constexpr, NS: tl.constexpr):
    """(sequence, its first flat block, its end) of flat block p, the packed sequences' blocks one after another,
    max(1, cdiv(L, BT)) each (an empty sequence keeps one, which writes its m_T and dm_0); past the last block
    (N, all blocks, _BIG). cu read NS sequences at a time: no layout tensors, no host sync."""
    ar = tl.arange(0, NS)
    seq = tl.full([], 0, tl.int32)
    c0 = tl.full([], 0, tl.int32)
    c1 = tl.full([], _BIG, tl.int32)
    done = tl.full([], 0, tl.int32)
    for s0 in range(0, N, NS):
        ks = s0 + ar
        km = ks < N
        lo = tl.load(cu + ks, mask=km, other=0)
        hi = tl.load(cu + ks + 1, mask=km, other=0)
        nb = tl.where(km, tl.maximum((hi - lo + BT - 1) // BT, 1), 0).to(tl.int32)
        end = tl.cumsum(nb, 0) + done
        before = km & (end <= p)
        seq += tl.sum(before.to(tl.int32), 0)
        c0 = tl.maximum(c0, tl.max(tl.where(before, end, 0), 0))
        c1 = tl.minimum(c1, tl.min(tl.where(km & (end > p), end, _BIG), 0))
        done += tl.sum(nb, 0)
    return seq, c0, c1


@triton.jit
def _block(p, cu, N, T, NB, BT: tl.constexpr, NS: tl.constexpr, VARLEN: tl.constexpr):
    """Flat block p: (sequence, its first row in [B * T], its length, p's first step in it, the flat range
    [c0, c1) of its blocks). Without varlen every sequence has NB blocks; with it, p past the last block gets
    length 0 and an empty range (it writes nothing)."""
    if VARLEN:
        seq, c0, c1 = _find(p, cu, N, BT, NS)
        ok = seq < N
        s = tl.minimum(seq, N - 1)
        bos = tl.load(cu + s).to(tl.int64)
        L = tl.where(ok, (tl.load(cu + s + 1).to(tl.int64) - bos).to(tl.int32), 0)
        c0 = tl.where(ok, c0, p)
        c1 = tl.where(ok, c1, p)
        return s, bos, L, (p - c0) * BT, c0, c1
    else:
        n = p // NB
        c0 = n * NB
        return n, n.to(tl.int64) * T, T, (p - c0) * BT, c0, c0 + NB


def _seq_piece(NC):
    """Sequences whose cu_seqlens a program reads at a time to find its block (`_find`): 1024 on a GPU, so one
    piece up to 1024 sequences; the interpreter's NC, so that tests cross pieces."""
    return NC if INTERPRET else max(NC, 1024)


def _grid(B, T, N, BT, varlen):
    """(flat blocks, blocks per sequence): without varlen B sequences of cdiv(T, BT) blocks; with it a bound on
    Σ max(1, cdiv(L, BT)) over the packed sequences (<= T / BT + N), taken on the host from shapes alone (the
    blocks past the last sequence's end exit)."""
    if varlen:
        return T // BT + N, 1
    NB = max(cdiv(T, BT), 1)
    return B * NB, NB
