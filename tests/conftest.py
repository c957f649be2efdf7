import os
import sys

# The suite is the CPU suite on every machine, CI's: the Triton kernels run through Triton's interpreter (chosen
# before any kernel is defined, so before ula's Triton module is imported) on CPU tensors, and a GPU, if the machine
# has one, is hidden, so that every test sees what CI sees. On an H200 machine with the GPU visible, 192 tests failed
# with kernels compiled (CPU tensors sent to them); with them interpreted, 2 failed and the suite ran past 520 s at
# -n 8 (the CLI, training and benchmark tests take a visible GPU). The GPU's own checks are benchmarks/gpu_smoke.py
# and the GPU scripts. ULA_TEST_GPU=1 keeps the GPU and compiles the kernels for it, and runs only the files written
# for that (GPU_FILES: their tensors on helpers.DEVICE); the rest build CPU tensors and are left out. On an H200 in
# session 31: 334 passed (benchmarks/results/gpu_compiled_tests_h200_session31.txt); in session 32, with
# test_gpu_host_waits.py, 351 passed and 2 failed (retention's host-made decays, since fixed: the two files of
# benchmarks/results/gpu_host_waits_measure_h200_session32.log then passed; with the language-model steps,
# test_gpu_host_waits.py 36 passed: gpu_host_waits_lm_h200_session32.txt). Session 33, on an H100 with
# test_gpu_graph_layouts.py: 378 passed (benchmarks/results/gpu_graph_layouts_session33.txt).
GPU_FILES = {"test_triton.py", "test_extreme.py", "test_state_precision.py", "test_determinism.py",
             "test_audit_fixes_ops.py", "test_decode_static.py", "test_gpu_host_waits.py",
             "test_gpu_measure.py", "test_gpu_graph_layouts.py", "test_abc_softmax_kernels.py",
             "test_gpu_entry_kernels.py"}
if os.environ.get("ULA_TEST_GPU") != "1":  # a shell's TRITON_INTERPRET=0 too (192 failures with the GPU visible)
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Outputs of the kernels are poisoned (NaN) before each call so an element that no kernel writes fails.
os.environ.setdefault("ULA_POISON_OUTPUTS", "1")

sys.path.insert(0, os.path.dirname(__file__))


import pytest  # noqa: E402
import torch  # noqa: E402

from interpreter_speed import patch_language_once_per_launch  # noqa: E402

# Under pytest-xdist (`make test` runs a worker per core): the cores shared out among the workers, since
# torch's default of one intra-op thread per core in every worker oversubscribes them (float64 gradchecks ran 5x
# slower).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_ignore_collect(collection_path, config):
    """With ULA_TEST_GPU=1, the test files not written for the GPU are not collected."""
    if os.environ.get("ULA_TEST_GPU") == "1" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in GPU_FILES
    return None


# the longest tests (minutes on a 2-core machine), run first: xdist gives each worker a first chunk of consecutive
# tests, then the rest in collection order as workers free up, and one of these handed out last would leave the other
# workers idle while it runs. First, they run one after another in the first worker's chunk (the process groups of
# context parallelism not at once) while the other workers take the rest.
LONG_FIRST = ("test_offline_compile.py::", "test_context_parallel.py::test_context_parallel_equals_single_process",
              "test_train_cp.py::")


def pytest_collection_modifyitems(config, items):
    """The longest tests first (LONG_FIRST, in its order; the rest in theirs). Files named on the command line are
    collected whatever pytest_ignore_collect says: with ULA_TEST_GPU=1 the tests of those not written for the GPU
    are skipped (they would send CPU tensors to the compiled kernels)."""
    items.sort(key=lambda item: next((i for i, s in enumerate(LONG_FIRST) if s in item.nodeid), len(LONG_FIRST)))
    if os.environ.get("ULA_TEST_GPU") != "1":
        return
    skip = pytest.mark.skip(reason="not written for the GPU: ULA_TEST_GPU=1 runs the files of conftest.GPU_FILES")
    for item in items:
        if item.path.name.startswith("test_") and item.path.name not in GPU_FILES:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """Tiny tensors: one intra-op thread is faster and, on a busy 2-core machine, avoids spinning threads."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


patch_language_once_per_launch()
