"""`ula info`: what this machine gives ula. It prints the versions, each GPU, and the path that backend="auto" takes
on it, asked of the same code that decides (ula/core/backends.py), with the warnings it would give. These are the
lines to put in a bug report or beside a measurement."""
import json
import os
import platform
import sys
import warnings

import torch


def _triton():
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", "unknown")


def _path(device):
    """(the path backend="auto" runs on device, [the warnings it gives]) from backends.chunk_fn itself."""
    from .core import backends
    from .core.chunk_torch import chunk_recurrence
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            fn = backends.chunk_fn("auto", device)
            path = "the PyTorch chunk path" if fn is chunk_recurrence else "ula's Triton kernels"
        except Exception as e:  # noqa: BLE001  (what a call would meet is the finding)
            path = f"error: {type(e).__name__}: {e}"
    return path, [str(w.message) for w in seen]


def _gpus():
    from .core.backends import capability
    out = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        p = torch.cuda.get_device_properties(i)
        major, minor = capability(torch.device("cuda", i))
        path, notes = _path(torch.device("cuda", i))
        out.append(dict(index=i, name=torch.cuda.get_device_name(i), capability=f"{major}.{minor}",
                        memory_gib=round(p.total_memory / 2 ** 30, 1),
                        multiprocessors=getattr(p, "multi_processor_count", None), auto=path, notes=notes))
    return out


def report():
    """Everything `ula info` prints, as a dict (its --json form)."""
    import ula
    from .core.backends import MIN_TRITON, triton_problem
    cpu_path, cpu_notes = _path(torch.device("cpu"))
    return dict(
        ula=ula.__version__, ula_path=os.path.dirname(os.path.abspath(ula.__file__)),
        python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
        cuda=torch.version.cuda, triton=_triton(), triton_needed=".".join(map(str, MIN_TRITON)),
        triton_problem=triton_problem(), gpus=_gpus(), cpu=dict(auto=cpu_path, notes=cpu_notes),
        cpu_threads=torch.get_num_threads(), triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        settings={k: v for k, v in sorted(os.environ.items()) if k.startswith("ULA_")})


def text(r):
    """The report as lines for people."""
    lines = [f"ula {r['ula']} ({r['ula_path']})",
             f"python {r['python']} on {r['platform']}",
             f"torch {r['torch']} (CUDA {r['cuda'] or 'none: a CPU build'})",
             f"triton {r['triton'] or 'not installed'} (the kernels need >= {r['triton_needed']}: "
             f"{r['triton_problem'] or 'ok'})"]
    if not r["gpus"]:
        lines.append("GPUs: none visible")
    for g in r["gpus"]:
        lines.append(f"cuda:{g['index']} {g['name']}, compute capability {g['capability']}, {g['memory_gib']} GiB, "
                     f"{g['multiprocessors']} SMs: backend='auto' runs {g['auto']}")
        lines += [f"  warning: {n}" for n in g["notes"]]
    lines.append(f"CPU tensors ({r['cpu_threads']} threads): backend='auto' runs {r['cpu']['auto']}")
    lines += [f"  warning: {n}" for n in r["cpu"]["notes"]]
    if r["triton_interpret"]:
        lines.append("TRITON_INTERPRET=1: backend='triton' runs the kernels on the CPU through Triton's interpreter "
                     "(slow; for tests)")
    lines += [f"setting {k}={v}" for k, v in r["settings"].items()] or ["settings: none (no ULA_* variables)"]
    return lines


def main(as_json=False):
    r = report()
    print(json.dumps(r, indent=2) if as_json else "\n".join(text(r)))
    return 0
