import os
import sys

# Without a GPU, Triton kernels run through Triton's interpreter; it must be chosen before any kernel is
# defined, so before ula's Triton module is imported. Outputs of the kernels are poisoned (NaN) before
# each call so an element that no kernel writes fails the comparison.
try:
    import torch
    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("ULA_POISON_OUTPUTS", "1")

sys.path.insert(0, os.path.dirname(__file__))


import pytest  # noqa: E402

# Under pytest-xdist (`make test` runs a worker per core): the cores shared out among the workers, since
# torch's default of one intra-op thread per core in every worker oversubscribes them (float64 gradchecks ran 5x
# slower).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture
def one_thread():
    """Tiny tensors: one intra-op thread is faster and, on a busy 2-core machine, avoids spinning threads."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)



from interpreter_speed import patch_language_once_per_launch  # noqa: E402

patch_language_once_per_launch()
