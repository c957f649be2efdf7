"""Compile the Triton kernels for an NVIDIA GPU without one: the launches that a forward+backward makes are
recorded on the CPU (kernels not run), then each distinct configuration is compiled by Triton for a target
(default sm_90, an H100) down to a cubin, and ptxas reports registers and spills. Catches what the interpreter
cannot (the GPU compiler's own errors, bfloat16 matmul operands, shared memory, spills) before device time.

Must run in a process where TRITON_INTERPRET was unset when ula's kernels were defined (`python3
tests/offline_compile.py [--all]`; tests/test_offline_compile.py spawns one). Without --all it compiles a covering
subset of the launches (`covering`), every launch's kernel and every value of its settings at least once.
"""
import os
import re
import subprocess
import sys
import tempfile

import torch

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.bool: "i1"}


# the core checks that a log decay is finite and <= 0: mLSTMexp's gate kernel writes one
_CHECKED_OUTPUTS = {"_mlstm_gates_fwd_kernel": ("ldp", "logw", "m", "mT")}


def record(run):
    """Calls run() with every Triton launch of ula recorded instead of executed. Returns the distinct launches
    as (kernel, signature, constexprs, num_warps, attrs, num_stages: None for Triton's default)."""
    assert os.environ.get("TRITON_INTERPRET") != "1", "kernels defined under the interpreter cannot be compiled"
    from ula.core.triton import cumsum, decay_grad, output, state, step  # noqa: F401  (defines the kernels)
    from ula.core.triton import entry, state_join  # noqa: F401  (context parallelism's entry term; the segments' join)
    from ula.ops import _abc_softmax_kernels, _l2norm, _mlstm_epilogue, _mlstm_gate_kernels  # noqa: F401
    from ula.ops import _normalized_epilogue  # noqa: F401
    mods = [sys.modules[f"ula.core.triton.{m}"] for m in ("cumsum", "decay_grad", "output", "state", "step", "entry",
                                                          "state_join")]
    mods += [sys.modules[f"ula.ops.{m}"] for m in ("_mlstm_gate_kernels", "_mlstm_epilogue", "_normalized_epilogue",
                                                   "_l2norm", "_abc_softmax_kernels")]  # the families' own
    seen = {}

    def fake_launch(kernel, grid, *args, num_warps=4, num_stages=None, **constexprs):
        names = kernel.arg_names
        sig, attrs = {}, {}
        for i, (n, a) in enumerate(zip(names, args)):
            if isinstance(a, torch.Tensor):
                sig[n] = "*" + _TYPES[a.dtype]
                div = a.data_ptr() % 16 == 0
            elif isinstance(a, bool):
                sig[n], div = "i1", False
            elif isinstance(a, int):
                sig[n], div = ("i32" if -2**31 <= a < 2**31 else "i64"), a % 16 == 0
            else:
                sig[n], div = "fp32", False
            if div:  # what Triton's launcher tells its compiler about aligned pointers and multiples of 16
                attrs[(i,)] = [["tt.divisibility", 16]]
        for n in constexprs:
            sig[n] = "constexpr"
        if isinstance(num_stages, tuple):  # preferences: the first is what a GPU with enough shared memory runs
            num_stages = num_stages[0]
        key = (kernel.fn.__name__, tuple(sig.items()), tuple(sorted(constexprs.items())), num_warps,
               tuple(sorted(attrs)), num_stages)
        seen.setdefault(key, (kernel, sig, dict(constexprs), num_warps, attrs, num_stages))
        for n, a in zip(names, args):  # outputs that host code checks later: zeros, as the kernel is not run
            if n in _CHECKED_OUTPUTS.get(kernel.fn.__name__, ()):
                a.zero_()

    saved = [m.launch for m in mods]
    # the runtime check of backend="triton" reads the environment; the kernels above are already defined
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for m in mods:
            m.launch = fake_launch
        run()
    finally:
        for m, f in zip(mods, saved):
            m.launch = f
        del os.environ["TRITON_INTERPRET"]
    return list(seen.values())


def _ptxas(arch):
    """The ptxas that this Triton runs for sm_<arch> (3.9 takes its newer ptxas-blackwell from sm_90 on; the older
    one refuses the PTX version 3.9 writes)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        try:
            return get_ptxas(arch).path
        except TypeError:  # before 3.7: no argument
            return get_ptxas().path
    except (ImportError, AttributeError, RuntimeError):
        import triton
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


class _PtxasLog:
    """Keeps the log of the ptxas run that Triton's own compile makes for its cubin (it runs ptxas -v with stderr
    to a file), so that registers and spills are read from it rather than from a second ptxas run over the same PTX
    (half the ptxas time of a cold compile). Empty where this Triton runs ptxas otherwise: then ptxas runs again."""

    def __init__(self):
        self.text = ""

    def __enter__(self):
        from triton.backends.nvidia import compiler
        self._mod, self._run = compiler, getattr(compiler, "subprocess", None)
        if self._run is not None:
            real = self._run.run
            outer = self

            class Shim:  # Triton's module sees subprocess with run wrapped; everything else as it was
                def __getattr__(self, name):
                    return getattr(outer._run, name)

                @staticmethod
                def run(cmd, *a, **kw):
                    res = real(cmd, *a, **kw)
                    err = kw.get("stderr")
                    if "ptxas" in os.path.basename(str(cmd[0])) and hasattr(err, "name"):
                        with open(err.name) as f:
                            outer.text = f.read()
                    return res
            compiler.subprocess = Shim()
        return self

    def __exit__(self, *exc):
        if self._run is not None:
            self._mod.subprocess = self._run


def compile_one(kernel, sig, constexprs, num_warps, attrs=None, arch=90, num_stages=None):
    """Triton's compile for CUDA sm_<arch> down to a cubin, with ptxas -v's report of it: (registers, spill bytes
    stored, spill bytes loaded, shared memory bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs)
    from ula.core.triton.utils import _OPTIONS  # the launches' options (FP fusion stated)
    opts = {"num_warps": num_warps, **_OPTIONS, **({} if num_stages is None else {"num_stages": num_stages})}
    with _PtxasLog() as log:
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    out = log.text
    if "Used " not in out:  # served from Triton's cache, or a Triton that runs ptxas its own way: run it here
        out = _ptxas_report(k.asm["ptx"], arch)
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return regs, int(spill.group(1)), int(spill.group(2)), k.metadata.shared


def _ptxas_report(ptx, arch):
    """ptxas -v's report on a PTX text."""
    ptxas = _ptxas(arch)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        # the PTX's own target (Triton writes sm_90a on Hopper, sm_100a / sm_120a on Blackwell)
        arch_flag = "-arch=" + re.search(r"^\.target\s+(sm_\w+)", ptx, re.M).group(1)
        return subprocess.run([ptxas, arch_flag, "-v", f.name, "-o", os.devnull], capture_output=True, text=True,
                              check=True).stderr
    finally:
        os.unlink(f.name)


def core_cases(B=2, T=300, H=2, K=128, V=128, dtype=torch.bfloat16):
    """Forward+backward of ula.linear_attention the way a GPU runs them: every decay kind at K = V = 128, decays
    requiring gradients (a learnable constant one takes float32 matmuls), mLSTM's key gate, then reverse,
    varlen, a tiled chunk, a right decay, float16, K = 96 / V = 256, K = V = 100; mLSTMexp (its gate scan, the
    normalizer inside the forward's kernels); normalized attention (L2 norm, epilogue); GSA's mixed-dtype passes;
    context parallelism's entry term; and the decoding step kernel."""
    import torch.nn.functional as F

    import ula

    def run():
        g = torch.Generator().manual_seed(0)
        r = lambda *s, dt=dtype: torch.randn(*s, generator=g).to(dt).requires_grad_()  # noqa: E731
        lsig = lambda *s: F.logsigmoid(torch.randn(*s, generator=g) + 3).requires_grad_()  # noqa: E731
        cases = [dict(), dict(ld=torch.full((H,), -0.1).requires_grad_()), dict(ld=lsig(B, T, H)),
                 dict(ld=lsig(B, T, H, K)), dict(ld=lsig(B, T, H), key_gate=lsig(B, T, H)),
                 dict(ld=lsig(B, T, H), reverse=True), dict(ld=lsig(1, B * T, H, K), cu=[0, 7, 250, B * T]),
                 dict(ld=lsig(B, T, H), chunk_size=512), dict(ld=lsig(B, T, H, K), rd=lsig(B, T, H, V)),
                 dict(ld=lsig(B, T, H, K), dtype=torch.float16), dict(ld=lsig(B, T, H), Kx=96, Vx=256),
                 dict(ld=lsig(B, T, H, 100), Kx=100, Vx=100),  # padded to 112 for the kernels
                 dict(rd=lsig(B, T, H, 64), Vx=64)]  # a right decay alone (GSA's first pass, 64 slots)
        for c in cases:
            cu = c.get("cu")
            Bc, Tc = (1, B * T) if cu else (B, T)
            Kc, Vc, dt = c.get("Kx", K), c.get("Vx", V), c.get("dtype", dtype)
            ld = c.get("ld")
            if ld is not None and ld.dim() == 4 and ld.shape[-1] != Kc:
                ld = lsig(Bc, Tc, H, Kc)
            q, k, v = r(Bc, Tc, H, Kc, dt=dt), r(Bc, Tc, H, Kc, dt=dt), r(Bc, Tc, H, Vc, dt=dt)
            o, S = ula.linear_attention(q, k, v, ld, c.get("rd"), key_gate=c.get("key_gate"),
                                        output_final_state=True, reverse=c.get("reverse", False),
                                        chunk_size=c.get("chunk_size"), cu_seqlens=torch.tensor(cu) if cu else None,
                                        backend="triton")
            (o.float().sum() + S.sum()).backward()
        # mLSTMexp: the gate scan (ula/ops/_mlstm_gate_kernels.py), the forward's normalizer inside the
        # kernels (ula/core/ones.py) and the epilogue (ula/ops/_mlstm_epilogue.py), with an initial state
        q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
        i, f = torch.randn(B, T, H, generator=g).requires_grad_(), torch.randn(B, T, H, generator=g).requires_grad_()
        init = (torch.zeros(B, H, K, V), torch.zeros(B, H, K), torch.zeros(B, H))
        h, (C, n, m) = ula.mlstm(q, k, v, i, f, variant="exp", initial_state=init, output_final_state=True,
                                 backend="triton")
        (h.float().sum() + C.sum() + n.sum()).backward()
        # the gate scan alone with cu_seqlens and m_0, on its parallel and its sequential kernels (PARALLEL False,
        # kept for benchmarks/gpu_gate_tiles.py --sequential)
        from ula.ops import _mlstm_gate_kernels as gates
        for par in (True, False):
            gates.PARALLEL = par
            i1, f1 = (torch.randn(1, B * T, H, generator=g).requires_grad_() for _ in range(2))
            outs = gates.mlstm_exp_gates(i1, f1, torch.zeros(3, H).requires_grad_(), torch.tensor([0, 7, 250, B * T]),
                                         torch.float32)
            sum(o.sum() for o in outs).backward()
        gates.PARALLEL = True
        # normalized attention: the L2 norm, the a part and the division in the core's kernels
        # (ula/ops/_l2norm.py, _normalized_fused.py); with a width the column-of-ones kernels do not take (V = 24), the
        # generic core call and the epilogue kernels (_normalized_epilogue.py)
        # (b a tensor: the L2 norm as its own Function; b a float: inside, its forward with 1 / |x|)
        for Vn, b in ((V, torch.ones(H).requires_grad_()), (24, torch.ones(H).requires_grad_()), (V, 2.0)):
            q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, Vn)
            o, S = ula.normalized_linear_attention(q, k, v, 1.0, b, output_final_state=True, backend="triton")
            (o.float().sum() + S.sum()).backward()
        # GSA (64 slots): s in float32 beside bfloat16 q, k (pass 1) and v (pass 2), the softmax output in float32
        # (ula/ops/gsa.py)
        q, k, v, s = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), r(B, T, H, 64)
        o, S = ula.gsa(q, k, v, s, lsig(B, T, H, 64), output_final_state=True, backend="triton")
        (o.float().sum() + S[0].sum() + S[1].sum()).backward()
        # ABC's cumulative softmax (ula/ops/_abc_softmax_kernels.py), packed with an initial state, bf16 logits
        cu = torch.tensor([0, 7, 250, B * T])
        q, k, v, w = r(1, B * T, H, K), r(1, B * T, H, K), r(1, B * T, H, V), r(1, B * T, H, 64)
        z0 = (torch.zeros(3, H, K, 64), torch.zeros(3, H, 64, V), torch.zeros(3, H, 64).requires_grad_())
        o, S = ula.abc(q, k, v, w, initial_state=z0, output_final_state=True, cu_seqlens=cu, backend="triton")
        (o.float().sum() + S[2].sum()).backward()
        # context parallelism's entry term (ula/core/triton/entry.py), scalar and vector decays
        from ula.core.cp_entry import add_entry_term
        for gl in (lsig(B, T, H, 1), lsig(B, T, H, K)):
            o, q = r(B, T, H, V), r(B, T, H, K)
            E = torch.randn(B, H, K, V).requires_grad_()
            add_entry_term(o, q, gl, None, E, K ** -0.5, False, "triton").float().sum().backward()
        # with mLSTMexp's normalizer column beside E (float32), all gradients formed, and E's alone as its
        # context-parallel path asks
        for need_q in (True, False):
            E, En = torch.randn(B, H, K, V).requires_grad_(), torch.randn(B, H, K, 1).requires_grad_()
            q = r(B, T, H, K).requires_grad_(need_q)
            o, den = add_entry_term(r(B, T, H, V), q, lsig(B, T, H, 1), None, E, K ** -0.5, False, "triton",
                                    column=(torch.randn(B, T, H), En))
            (o.float().sum() + den.sum()).backward()
        with torch.no_grad():  # the decoding step kernel
            from ula.core.triton.step import recurrent_step_triton
            q, k, v = (torch.randn(B, H, D).to(dtype) for D in (K, K, V))
            recurrent_step_triton(q, k, v, F.logsigmoid(torch.randn(B, H, K)), None, torch.zeros(B, H, K, V), 0.1)
    return run


def covering(launches):
    """A subset of the launches in which, per kernel, every constexpr's every value, every (warps, stages) pair,
    every argument-dtype pattern and every alignment pattern occurs at least once (greedy, in recording order: the
    same subset on every run). The suite compiles these (102 of 221 today, ~1.6 s each cold on a 2-core machine;
    all of them took 10 minutes there); `--all` compiles every one."""
    def features(launch):
        kernel, sig, cx, w, attrs, stages = launch
        name = kernel.fn.__name__
        return ({(name, "cx", n, v) for n, v in cx.items()} | {(name, "launch", w, stages)}
                | {(name, "dtypes", tuple(sig.values())), (name, "aligned", tuple(sorted(attrs)))})
    todo = {i: features(launch) for i, launch in enumerate(launches)}
    covered = set()
    while todo:
        best = max(todo, key=lambda i: (len(todo[i] - covered), -i))  # (ties: the first recorded)
        if not todo[best] - covered:
            break
        covered |= todo.pop(best)
    return [launch for i, launch in enumerate(launches) if i not in todo]  # (recording order)


def report(launches, arch=90, out=print, only=None):
    """Compiles every recorded launch (those in only, if given; the others print as "not compiled"); prints one line
    each. Returns the lines of those that failed."""
    failed = []
    compiled = None if only is None else {id(launch) for launch in only}
    for launch in launches:
        kernel, sig, cx, w, attrs, stages = launch
        tag = f"{kernel.fn.__name__} warps={w} stages={stages or 'default'} "
        tag += " ".join(f"{k}={v}" for k, v in cx.items())
        if compiled is not None and id(launch) not in compiled:
            out(f"not compiled  {tag}")
            continue
        try:
            regs, st, ld, smem = compile_one(kernel, sig, cx, w, attrs, arch, stages)
            out(f"ok    regs {regs:3d} spill {st:5d}/{ld:5d} B smem {smem:6d} B  {tag}")
        except Exception as e:  # noqa: BLE001  (any compiler failure is the finding)
            failed.append(tag)
            out(f"FAIL  {tag}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return failed


if __name__ == "__main__":
    recorded = record(core_cases())
    sys.exit(1 if report(recorded, only=None if "--all" in sys.argv[1:] else covering(recorded)) else 0)
