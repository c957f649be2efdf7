"""Cold compile seconds of one op's forward+backward for an H100, measured on the CPU: the launches are recorded
(tests/offline_compile.py, kernels not run), then each distinct configuration is compiled by Triton for sm_90 with
an empty cache. An estimate of the GPU first call's compile share (issue 3: at most 20 s), slower than the GPU
host's CPU may be, and counting ptxas twice (offline_compile.compile_one reruns it for its report).

    python3 benchmarks/cpu_compile_time.py scalar vector gsa     (TRITON_INTERPRET unset)"""
import os
import sys
import tempfile
import time

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..")]
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import offline_compile as oc  # noqa: E402
import ula  # noqa: E402

B, T, H, K, V = 2, 300, 2, 128, 128


def run_op(op):
    def run():
        g = torch.Generator().manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g).bfloat16().requires_grad_()  # noqa: E731
        lsig = lambda *s: F.logsigmoid(torch.randn(*s, generator=g) + 3).requires_grad_()  # noqa: E731
        q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
        if op == "gsa":
            o, _ = ula.gsa(q, k, v, None, lsig(B, T, H, 64), backend="triton")
        else:
            ld = {"scalar": lsig(B, T, H), "vector": lsig(B, T, H, K)}[op]
            o, _ = ula.linear_attention(q, k, v, ld, None, backend="triton")
        o.float().sum().backward()
    return run


for op in sys.argv[1:] or ["scalar", "vector", "gsa"]:
    launches = oc.record(run_op(op))
    t0 = time.perf_counter()
    for kernel, sig, cx, w, attrs, stages in launches:
        oc.compile_one(kernel, sig, cx, w, attrs, num_stages=stages)
    print(f"{op}: {len(launches)} configurations, {time.perf_counter() - t0:.1f} s", flush=True)
