"""The suite's interpreter speed-ups (tests/interpreter_speed.py) answer as Triton's own code."""
import pytest

tl = pytest.importorskip("triton.language")
import triton  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


def test_cached_np_dtypes_answer_as_the_original():
    if not hasattr(interpreter, "_get_np_dtype"):
        pytest.skip("this Triton's interpreter has no _get_np_dtype: nothing patched")
    fast = interpreter._get_np_dtype
    assert getattr(fast, "_cached", False), "conftest's patch_language_once_per_launch did not cache the table"
    scalars = [tl.int1, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16,
               tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float8e5, tl.float8e4nv]
    types = scalars + [tl.pointer_type(tl.float32)] + [tl.block_type(t, [4, 8]) for t in scalars]
    types.append(tl.block_type(tl.pointer_type(tl.bfloat16), [16]))
    for t in types * 2:  # twice: the second answer comes from the table
        assert fast(t) == fast.original(t), t
    with pytest.raises(KeyError):
        fast(tl.void)


def test_tuple_type_names_format_when_read():
    t = tl.core.tuple_type([tl.int32, tl.float32], ["a", "b"])
    assert isinstance(type(t).__dict__.get("name"), property), "conftest did not make tuple names lazy"
    assert t.name == str(t) == "[a:int32,b:fp32]"
    assert str(tl.core.tuple_type([tl.int64])) == "[:int64]"
    assert t == tl.core.tuple_type([tl.int32, tl.float32], ["a", "b"])
    assert t != tl.core.tuple_type([tl.int32, tl.float32])


def test_tuple_types_work_out_when_read():
    cls = tl.core.tuple
    assert isinstance(cls.__dict__.get("type"), property), "conftest did not make tuple types lazy"
    values = [tl.constexpr(4), 3, 2.0, tl.float32]
    t = cls(values)
    assert t._type is None  # not worked out yet
    eager = cls.__new__(cls)
    cls.__init__.original(eager, values)  # Triton's own constructor
    assert t.type == eager.type == tl.core._type_for_tuple_values(values)
    assert str(t.type) == "[:constexpr_type[4],:constexpr_type[3],:constexpr_type[2.0],:constexpr_type[fp32]]"
    given = tl.core.tuple_type([tl.int32], ["a"])
    assert cls([tl.constexpr(1)], given).type is given
    assert cls([tl.constexpr(1)], [tl.int32]).type == tl.core.tuple_type([tl.int32])  # a list: made a tuple type
    t._setitem(1, tl.constexpr(5))  # Triton's own mutation sets the type anew
    assert t.type == tl.core._type_for_tuple_values([tl.constexpr(4), 5, 2.0, tl.float32]) != \
        tl.core._type_for_tuple_values(values)


@triton.jit
def _pair_max(m1, s1, m2, s2):  # a running (max, steps since it was last reached), ties to the later
    take = m2 >= m1
    return tl.where(take, m2, m1), tl.where(take, s2, s1 + s2)


@triton.jit
def _scan_kernel(x, out_m, out_s, red_m, red_s, AXIS: tl.constexpr, REV: tl.constexpr, BT: tl.constexpr,
                 BM: tl.constexpr):
    offs = tl.arange(0, BT)[:, None] * BM + tl.arange(0, BM)[None, :]
    v = tl.load(x + offs)
    m, s = tl.associative_scan((v, tl.full([BT, BM], 1.0, tl.float32)), AXIS, _pair_max, reverse=REV)
    tl.store(out_m + offs, m)
    tl.store(out_s + offs, s)
    rm, rs = tl.reduce((v, tl.full([BT, BM], 1.0, tl.float32)), AXIS, _pair_max, keep_dims=True)
    roffs = tl.arange(0, BM)[None, :] if AXIS == 0 else tl.arange(0, BT)[:, None]
    tl.store(red_m + roffs, rm)
    tl.store(red_s + roffs, rs)


@pytest.mark.parametrize("axis,reverse", [(0, False), (1, False), (0, True)])
def test_scans_by_slices_answer_as_the_element_by_element_scan(axis, reverse):
    import torch
    scan_cls, reduce_cls = getattr(interpreter, "ScanOps", None), getattr(interpreter, "ReduceOps", None)
    if not (hasattr(scan_cls, "generic_scan") and hasattr(reduce_cls, "generic_reduce")):
        pytest.skip("this Triton's interpreter has no generic scan: nothing patched")
    assert getattr(scan_cls.generic_scan, "_by_slices", False), "conftest did not patch the scans"
    x = torch.randint(-3, 4, (8, 4)).float()  # integers: ties everywhere
    outs = []
    for scan, reduce in ((scan_cls.generic_scan, reduce_cls.generic_reduce),
                         (scan_cls.generic_scan.original, reduce_cls.generic_reduce.original)):
        saved = scan_cls.generic_scan, reduce_cls.generic_reduce
        scan_cls.generic_scan, reduce_cls.generic_reduce = scan, reduce
        try:
            got = [torch.full((8, 4), float("nan")), torch.full((8, 4), float("nan")),
                   torch.full((8 if axis else 4,), float("nan")), torch.full((8 if axis else 4,), float("nan"))]
            _scan_kernel[(1,)](x, *got, AXIS=axis, REV=reverse, BT=8, BM=4)
        finally:
            scan_cls.generic_scan, reduce_cls.generic_reduce = saved
        outs.append(got)
    for a, b in zip(*outs):
        assert not a.isnan().any() and torch.equal(a, b), (a, b)


@triton.jit
def _int32_ops_kernel(x, out, N: tl.constexpr):
    offs = tl.arange(0, N)
    a = tl.load(x + offs)
    tl.store(out + offs, a * 3 + a - 7)


def test_overflow_checks_run_only_when_asserted(monkeypatch):
    import dataclasses
    import torch
    from triton.language.semantic import TritonSemantic
    fast = TritonSemantic.binary_op_sanitize_overflow_impl
    assert getattr(fast, "_when_asserted", False), "conftest did not skip the dropped overflow checks"
    x = torch.tensor([1, 2**30, -2**30, 5], dtype=torch.int32)  # a * 3 overflows int32 in two lanes
    wrapped = ((x.long() * 4 - 7 + 2**31) % 2**32 - 2**31).int()
    for check in (fast, fast.original):  # the skip and Triton's own, debug off: the same wrapped results
        monkeypatch.setattr(TritonSemantic, "binary_op_sanitize_overflow_impl", check)
        out = torch.full_like(x, -1)
        _int32_ops_kernel[(1,)](x, out, N=4)
        assert torch.equal(out, wrapped)
    monkeypatch.setattr(TritonSemantic, "binary_op_sanitize_overflow_impl", fast)
    monkeypatch.setattr(interpreter.interpreter_builder, "options",
                        dataclasses.replace(interpreter.interpreter_builder.options, debug=True))
    with pytest.raises(Exception, match="int32 overflow detected"):  # debug on: Triton's check runs and fires
        _int32_ops_kernel[(1,)](x, torch.empty_like(x), N=4)
    small = torch.tensor([1, -2, 3, 4], dtype=torch.int32)
    out = torch.full_like(small, -1)
    _int32_ops_kernel[(1,)](small, out, N=4)  # and passes where nothing overflows
    assert torch.equal(out, small * 4 - 7)
