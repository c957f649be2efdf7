"""Would ula's kernels run on GPUs other than the H100 it is tuned on? Without such GPUs: every kernel configuration
that a forward+backward launches (tests/offline_compile.py's core_cases) is compiled for each target, and its shared
memory is held against that GPU's limit per block, with the retries that ula's launches make when a GPU refuses
(ula/core/triton/utils.py _launch_fitting: Triton's default stages, then 2, then 1). A configuration that fits at no
stage count is a call that raises on that GPU. Registers and spills come from ptxas.

    python3 benchmarks/offline_compile_gpus.py [ARCH ...]      (default 70 75 80 86 89 90 120)

Writes benchmarks/results/offline_compile_sm<arch>_triton<version>.txt per target. A compile report, not a timing."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

# the largest shared memory one block may take (cudaDevAttrMaxSharedMemoryPerBlockOptin), bytes
LIMITS = {70: (98304, "V100"), 75: (65536, "T4 / RTX 20xx"), 80: (166912, "A100"),
          86: (101376, "RTX 30xx / A40 / A10"), 89: (101376, "RTX 40xx / L4 / L40"), 90: (232448, "H100 / H200"),
          120: (101376, "RTX 50xx")}


def main(archs):
    import triton
    from offline_compile import compile_one, core_cases, record

    from ula.core.triton.utils import stage_tries
    launches = record(core_cases())
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    for arch in archs:
        limit, gpus = LIMITS[arch]
        fewer, failed, spills, worst = [], [], [], 0
        it = tqdm(launches, desc=f"sm_{arch}", leave=False) if tqdm else launches
        for kernel, sig, cx, w, attrs, stages in it:
            tag = f"{kernel.fn.__name__} warps={w} " + " ".join(f"{k}={v}" for k, v in cx.items())
            for i, s in enumerate(stage_tries(stages)):
                try:
                    regs, st, _, smem = compile_one(kernel, sig, cx, w, attrs, arch, s)
                except Exception as e:  # noqa: BLE001  (a compiler failure is the finding)
                    failed.append(f"FAIL  {tag} stages={s}: {type(e).__name__}: {str(e).splitlines()[:1]}")
                    break
                if smem <= limit:
                    worst = max(worst, smem)
                    if i > 0:
                        fewer.append(f"fewer stages  {tag}: fits at stages={s} ({smem} B)")
                    if st > 512:
                        spills.append((st, f"spill {st} B  {tag} stages={s}"))
                    break
            else:
                failed.append(f"NO FIT  {tag}: {smem} B at the fewest stages, limit {limit} B")
        spills.sort(key=lambda x: -x[0])
        head = (f"sm_{arch} ({gpus}, {limit} B per block): {len(launches) - len(failed)} of {len(launches)} run, "
                f"{len(fewer)} of them with fewer stages, {len(spills)} spill over 512 B per thread (largest "
                f"{spills[0][0] if spills else 0} B); largest shared memory taken {worst} B")
        lines = [f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} triton {triton.__version__}, "
                 f"{len(launches)} configurations (tests/offline_compile.py core_cases); command: "
                 f"python3 benchmarks/offline_compile_gpus.py {arch}", head]
        lines += ["  " + x for x in failed + fewer + [x[1] for x in spills]]
        name = f"offline_compile_sm{arch}_triton{triton.__version__}.txt"
        path = os.path.join(os.path.dirname(__file__), "results", name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{head}\n  -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or sorted(LIMITS)))
