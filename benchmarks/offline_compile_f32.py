"""Float32 matmul operands (float32 inputs; the passes of a learnable constant decay's gradient) at 4 and 8 warps,
read off the GPU compiler on the CPU: every state and output kernel configuration of a float32 forward+backward
(tests/offline_compile.py's cases) compiled for sm_90, with ptxas' spill bytes per thread. The launches are
recorded as they are now and compiled at both warp counts.

    env -u TRITON_INTERPRET PYTHONPATH=.:tests python3 benchmarks/offline_compile_f32.py"""
import torch

from offline_compile import core_cases, record, report

if __name__ == "__main__":
    recs = [x for x in record(core_cases(dtype=torch.float32))
            if x[0].fn.__name__ in ("_state_kernel", "_output_kernel")]
    for w in (4, 8):
        spills = []
        report([(k, sig, cx, w, at) for k, sig, cx, _, at in recs],
               out=lambda s: (print(s), spills.append(int(s.split()[4].rstrip("/")))))
        print(f"== {w} warps: {len(spills)} configurations, {sum(x > 128 for x in spills)} spill over 128 bytes, "
              f"largest {max(spills)} bytes\n")
