"""Byte-level text data: a corpus read from a file, a folder, or (default) the English documentation
that ships with Python (`pydoc_data.topics`), split into train and validation, and batches of windows.

Batch `step` of rank `rank` comes from a generator seeded by (seed, rank, step) alone, so the data
position is the step number: a resumed run sees exactly the batches the uninterrupted run would."""
import os

import torch

from .errors import UsageError


class DataError(UsageError):
    """An unreadable text path or an empty corpus."""


def builtin_corpus():
    """The pydoc topics of the standard library (about 0.5 MB of English text on the language)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise DataError(f"cannot read text file {path!r}: {e.strerror or e}; the text path (DATA) needs readable "
                        f"files") from e


def load_corpus(path=None):
    """bytes of the corpus. path: None (built-in), a file, or a folder (every file under it that holds
    no NUL byte, in sorted order, joined by blank lines)."""
    if path is None:
        data = builtin_corpus()
        name = "pydoc_data.topics"
    elif os.path.isdir(path):
        parts, binary = [], 0
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for fn in sorted(files):
                if fn.startswith("."):
                    continue
                b = _read(os.path.join(root, fn))
                if b"\0" in b[:8192]:
                    binary += 1
                elif b:
                    parts.append(b)
        if not parts:
            raise DataError(f"text folder {path!r} is empty: it needs at least one text file under it"
                            + (f" ({binary} binary files, with a NUL byte in the first 8 KiB, skipped)" if binary
                               else ""))
        data = b"\n\n".join(parts)
        name = path
    elif os.path.exists(path):
        data, name = _read(path), path
    else:
        raise DataError(f"text path {path!r} does not exist (give a text file or a folder of text files, "
                        f"or no path for the built-in corpus)")
    return data, name


def split(data, val_frac, seq_len, name="the corpus"):
    """(train uint8 tensor, val uint8 tensor): the last val_frac of the bytes is validation. Training
    needs seq_len + 2 bytes (two window starts), validation seq_len + 1."""
    n_val = max(seq_len + 1, int(len(data) * val_frac))
    if len(data) - n_val < seq_len + 2:
        what = "is empty" if not data else f"has {len(data)} bytes"
        raise DataError(f"the corpus {name} {what}; with --seq-len {seq_len} and --val-frac {val_frac} it needs "
                        f"at least {seq_len + 2} training bytes besides {n_val} validation bytes (give more text, "
                        f"a shorter --seq-len or a smaller --val-frac)")
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t[:-n_val].clone(), t[-n_val:].clone()


def train_batch(data, batch_size, seq_len, seed, rank, step):
    """(x, y) int64 [batch, seq_len]: random windows, the same for the same (seed, rank, step)."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + rank) * 1_000_000_007 + step) % 2**63)   # fits int64
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=g)
    w = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()
    return w[:, :-1], w[:, 1:]


def val_batches(data, batch_size, seq_len, max_batches):
    """Fixed windows spread evenly over the validation bytes."""
    n = max(1, min(max_batches * batch_size, (len(data) - 1) // seq_len))
    stride = max(1, (len(data) - seq_len - 1) // max(1, n - 1)) if n > 1 else 0
    starts = [min(i * stride, len(data) - seq_len - 1) for i in range(n)]
    for i in range(0, n, batch_size):
        w = torch.stack([data[s:s + seq_len + 1] for s in starts[i:i + batch_size]]).long()
        yield w[:, :-1], w[:, 1:]
