"""Tests only: a faster Triton interpreter, the same results. Called by tests/conftest.py and by the processes
that tests spawn (context parallelism), which do not load conftest."""
import os


def patch_language_once_per_launch():
    """Triton's interpreter re-patches triton.language at every call of a @triton.jit helper inside a kernel
    (inspecting hundreds of members each time: about a fifth of the suite's time), though the launch around it
    has already patched the same modules. Patch each module once per launch. Were a module left unpatched, the
    helper would fail loudly (the compiler's builder is absent), never pass silently."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover
        return
    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or not hasattr(interpreter, "_LangPatchScope"):  # pragma: no cover - a Triton before 3.6's
        return  # way of patching (a scope restored at the launch's end): leave it as it is
    patched = set()  # ids of the language modules patched in the running launch, empty between launches

    class _AlreadyPatched:
        def restore(self):
            pass

    def patch_once(fn):
        langs = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if patched and langs <= patched:
            return _AlreadyPatched()
        scope = patch(fn)
        if not patched:  # the launch's own patch: forget the modules when it restores them
            restore = scope.restore

            def restore_and_forget():
                patched.clear()
                restore()
            scope.restore = restore_and_forget
        patched.update(langs)
        return scope
    interpreter._patch_lang = patch_once

