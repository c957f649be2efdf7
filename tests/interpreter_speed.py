"""Tests only: a faster Triton interpreter, the same results. Called by tests/conftest.py and by the processes
that tests spawn (context parallelism), which do not load conftest."""
import os


def patch_language_once_per_launch():
    """Under TRITON_INTERPRET=1, the six speed-ups below (tests/test_interpreter_speed.py checks them against
    Triton's own code)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover
        return
    _patch_lang_once(interpreter)
    # the rest as well; each leaves a Triton whose interpreter lacks what it replaces as it is
    _cache_np_dtypes(interpreter, tl)
    _lazy_tuple_names(tl)
    _lazy_tuple_types(tl)
    _scans_by_slices(interpreter, tl)
    _overflow_checks_only_when_asserted()


def _patch_lang_once(interpreter):
    """Triton's interpreter re-patches triton.language at every call of a @triton.jit helper inside a kernel
    (inspecting hundreds of members each time: about a fifth of the suite's time), though the launch around it
    has already patched the same modules. Patch each module once per launch. Were a module left unpatched, the
    helper would fail loudly (the compiler's builder is absent), never pass silently."""
    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or not hasattr(interpreter, "_LangPatchScope"):  # pragma: no cover - a Triton before 3.6's
        return  # way of patching (a scope restored at the launch's end): leave it as it is
    import triton.language as tl
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


def _cache_np_dtypes(interpreter, tl):
    """The interpreter builds its table of Triton dtype -> numpy dtype anew on every cast, splat and masked load
    (a tenth of a kernel test's time); build it once. Same lookups, so the same KeyError for a type it lacks."""
    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or getattr(original, "_cached", False):
        return
    table = {}

    def get_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):  # pointers and blocks of them: uint64, as the original says
            return original(tt_dtype)
        found = table.get(key)
        if found is None:
            found = table[key] = original(key)
        return found
    get_np_dtype._cached = True
    get_np_dtype.original = original
    interpreter._get_np_dtype = get_np_dtype


def _lazy_tuple_names(tl):
    """Every tensor the interpreter makes builds a tuple of its shape, whose type formats its name string at once
    (a tenth of a kernel test's time) though only printing reads it; format it when read."""
    import inspect
    cls = getattr(tl.core, "tuple_type", None)
    if cls is None or isinstance(cls.__dict__.get("name"), property):
        return
    if list(inspect.signature(cls.__init__).parameters) != ["self", "types", "fields"]:
        return  # pragma: no cover - another Triton's tuple type: leave it as it is

    def __init__(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def name(self):
        return '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'
    cls.__init__ = __init__
    cls.name = property(name)


def _lazy_tuple_types(tl):
    """Every tensor the interpreter makes wraps its shape in a Triton tuple (and unwrapping a shape makes another),
    which works out the type of its values at once (a tenth of a kernel test's time), though the interpreter seldom
    reads it; work it out when read. A type given to the constructor is kept as given."""
    import inspect
    cls, type_for = getattr(tl.core, "tuple", None), getattr(tl.core, "_type_for_tuple_values", None)
    if cls is None or type_for is None or isinstance(cls.__dict__.get("type"), property):
        return
    if list(inspect.signature(cls.__init__).parameters) != ["self", "args", "type"]:
        return  # pragma: no cover - another Triton's tuple: leave it as it is
    tuple_type = tl.core.tuple_type

    def __init__(self, args, type=None):
        self.values = [i for i in args]
        self._type = type if type is None or isinstance(type, tuple_type) else tuple_type(type)

    def get_type(self):
        if self._type is None:
            self._type = type_for(self.values)
        return self._type

    def set_type(self, value):
        self._type = value
    __init__.original = cls.__init__
    cls.__init__ = __init__
    cls.type = property(get_type, set_type)


def _scans_by_slices(interpreter, tl):
    """A scan or reduction with a combine function of the kernel's own (ABC's logsumexp pairs, mLSTMexp's running
    max) runs element by element in the interpreter, one combine call per element (a fifth of ABC's tests). Run the
    same left fold along the axis one slice at a time instead: each lane sees the same combines in the same order;
    Triton's combine functions are elementwise, so they take a slice as they take a scalar."""
    import numpy as np
    scan_cls, reduce_cls = getattr(interpreter, "ScanOps", None), getattr(interpreter, "ReduceOps", None)
    if not (hasattr(scan_cls, "generic_scan") and hasattr(reduce_cls, "generic_reduce")):
        return  # pragma: no cover - another Triton's interpreter: leave it as it is
    if getattr(scan_cls.generic_scan, "_by_slices", False):
        return

    def fold(self, input, keep_all):
        """(outputs per step along the axis if keep_all, else the last step's) of the combine's left fold."""
        datas = [np.moveaxis(a.handle.data, self.axis, 0) for a in input]
        dtypes = [a.dtype for a in input]
        acc = [d[0].copy() for d in datas]
        outs = [np.empty_like(d) for d in datas] if keep_all else None
        for i in range(datas[0].shape[0]):
            if i:
                got = self.combine_fn.fn(*(self.to_tensor(x, t) for x, t in zip(acc, dtypes)),
                                         *(self.to_tensor(d[i], t) for d, t in zip(datas, dtypes)))
                got = got if isinstance(got, tuple) else (got,)
                acc = [np.broadcast_to(g.handle.data if isinstance(g, tl.core.tensor) else g, a.shape).astype(a.dtype)
                       for g, a in zip(got, acc)]
            if keep_all:
                for o, a in zip(outs, acc):
                    o[i] = a
        return [np.moveaxis(o, 0, self.axis) for o in outs] if keep_all else acc

    def generic_scan(self, input):
        return [self.to_tensor(o, a.dtype) for o, a in zip(fold(self, input, True), input)]

    original_reduce = reduce_cls.generic_reduce

    def generic_reduce(self, input):
        if self.axis is None or input[0].handle.data.ndim < 2:  # whole-tensor reductions: as Triton does them
            return original_reduce(self, input)
        ret = []
        for r, a in zip(fold(self, input, False), input):
            ret.append(self.to_tensor(np.expand_dims(r, self.axis) if self.keep_dims else r, a.dtype))
        return ret
    generic_scan._by_slices = True
    generic_scan.original = scan_cls.generic_scan
    generic_reduce.original = original_reduce
    scan_cls.generic_scan = generic_scan
    reduce_cls.generic_reduce = generic_reduce


def _overflow_checks_only_when_asserted():
    """Every int32 add, sub and mul in a kernel also runs in int64 with a range test (a third of a kernel test's
    time), whose only use is a device_assert, which Triton drops unless the builder's debug option is on (the
    interpreter's InterpreterOptions.debug: off). Skip that work when the assert would be dropped: the same results,
    the same errors; with debug on, Triton's own check runs."""
    try:
        from triton.language.semantic import TritonSemantic
    except ImportError:  # pragma: no cover - a Triton without the semantic class
        return
    original = TritonSemantic.__dict__.get("binary_op_sanitize_overflow_impl")
    if original is None or getattr(original, "_when_asserted", False):
        return

    def sanitize(self, lhs, rhs, binary_op):
        if not getattr(self.builder.options, "debug", True):
            return None
        return original(self, lhs, rhs, binary_op)
    sanitize._when_asserted = True
    sanitize.original = original
    TritonSemantic.binary_op_sanitize_overflow_impl = sanitize
