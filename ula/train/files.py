"""Output files that are never left half-written, and the check that an output folder can be written.

A result is written under a temporary name beside its final path (same folder, so the same file
system), flushed to disk (fsync) and renamed over the final path in one step (`os.replace`): the path
holds its former content or the whole new one, whatever fails in between. A failed write removes the
temporary and raises `OutputError` naming the path."""
import contextlib
import glob
import os
import secrets
import shutil

from .errors import OutputError


def _fsync(path, directory=False):
    try:
        fd = os.open(path, os.O_RDONLY if directory else os.O_RDWR)
    except OSError:          # a folder cannot be opened on some systems (Windows): nothing to flush there
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def _tmp_beside(path, tag="tmp"):
    """A fresh hidden name in the folder of path that keeps its extension (matplotlib reads the format
    from it)."""
    folder, base = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(base)
    return os.path.join(folder, f".{stem}.{os.getpid()}-{secrets.token_hex(4)}.{tag}{ext}")


def _failed(path, e, what):
    return OutputError(f"cannot write {what} {path!r}: {e.strerror or e}; what was there is left as it was")


def publish(tmp, path, what="the file"):
    """Flushes the file tmp to disk and renames it over path (one step), then flushes the folder."""
    try:
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(os.path.dirname(os.path.abspath(path)), directory=True)
    except OSError as e:
        raise _failed(path, e, what) from e


@contextlib.contextmanager
def atomic_path(path, what="the file"):
    """Yields a temporary path to write instead of path; it replaces path when the block ends well."""
    tmp = _tmp_beside(path)
    try:
        yield tmp
        publish(tmp, path, what)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _failed(path, e, what) from e
        raise


@contextlib.contextmanager
def atomic_dir(path, what="the folder"):
    """Yields a new temporary folder to fill instead of the folder path; when the block ends well, every
    file in it is flushed to disk and it takes the place of path (a former path is moved aside first and
    removed after). Temporaries left beside path by a killed earlier run are removed first."""
    folder, base = os.path.split(os.path.abspath(path))
    for stale in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(base)}.*.tmp")):
        shutil.rmtree(stale, ignore_errors=True)
    tmp, old = _tmp_beside(path), _tmp_beside(path, "old")
    try:
        os.makedirs(folder, exist_ok=True)
        os.mkdir(tmp)
        yield tmp
        for root, _, files in os.walk(tmp):
            for f in files:
                _fsync(os.path.join(root, f))
        _fsync(tmp, directory=True)
        if os.path.exists(path):
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(folder, directory=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(old) and not os.path.exists(path):
            os.replace(old, path)
        if isinstance(e, OSError):
            raise _failed(path, e, what) from e
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_files(folder, what="the files"):
    """Yields a temporary folder inside folder to write several files into; when the block ends well each
    of them replaces its namesake in folder (each whole; see publish). The temporary goes in any case."""
    tmp = _tmp_beside(os.path.join(folder, "files"))
    try:
        os.mkdir(tmp)
        yield tmp
        for name in sorted(os.listdir(tmp)):
            publish(os.path.join(tmp, name), os.path.join(folder, name), what)
    except OSError as e:
        raise _failed(folder, e, f"{what} in") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_out_dir(path, flag="--out"):
    """Raises OutputError unless path is a folder that can be written, or one that can be made (its
    nearest existing parent is a writable folder). Makes nothing."""
    p = os.path.abspath(path)
    probe = p
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        where = "is a file" if probe == p else f"lies under {probe!r}, which is a file"
        raise OutputError(f"{flag} {path!r} {where}; it needs a folder (an existing one, or one that can be made)")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == p else f": its nearest existing parent {probe!r}"
        raise OutputError(f"{flag} {path!r} is not writable{where}; it needs a folder you can write")
