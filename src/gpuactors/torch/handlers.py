"""Which aten ops the scheduler takes, and how each one's arguments become a node.

``TABLE`` maps an aten overload (``torch.ops.aten.relu.default``...) to a handler
``(batch, args, kwargs) -> Tensor``, built once at import, so the intercept path is
one dict lookup. A handler raises :class:`~.batch.Decline` for any argument it does
not reproduce exactly (the op then runs in PyTorch). In-place (``relu_``) and
``out=`` overloads share the functional op's handler, with a target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor

from gpuactors.torch import dtypes as D
from gpuactors.torch import program as P
from gpuactors.torch.batch import Batch, Decline
from gpuactors.torch.record import COMPARE, PROMOTE, dtype_code, pointwise, reduce

Handler = Callable[[Batch, tuple[Any, ...], dict[str, Any]], Tensor]
#: How a handler finds its output: a new tensor, args[0] (in place), kwargs["out"].
FUNCTIONAL, INPLACE, OUT = 0, 1, 2

_OP = P.OPCODES
_NUMBERS = (int, float, bool)


def _params(
    args: tuple[Any, ...], kwargs: dict[str, Any], spec: tuple[tuple[str, Any], ...], first: int
) -> list[Any]:
    """The values of the parameters ``spec`` (name, default) from position ``first`` on;
    Decline for a keyword argument the schema does not have."""
    names = {name for name, _ in spec}
    for key in kwargs:
        if key not in names and key != "out":
            raise Decline
    if len(args) > first + len(spec):
        raise Decline
    return [
        args[first + i] if first + i < len(args) else kwargs.get(name, default)
        for i, (name, default) in enumerate(spec)
    ]


def _target(args: tuple[Any, ...], kwargs: dict[str, Any], mode: int) -> Tensor | None:
    if mode == INPLACE:
        return cast(Tensor, args[0])
    if mode == OUT:
        out = kwargs.get("out")
        if not isinstance(out, Tensor):
            raise Decline
        return out
    return None


def _number(value: Any) -> float:
    if type(value) not in _NUMBERS:
        raise Decline
    return float(value)


def _bits(value: Any) -> int:
    return P.f32_bits(_number(value))


#: The largest finite value of each float dtype.
_LARGEST = {code: torch.finfo(getattr(torch, D.NAMES[code])).max for code in D.FLOATS}


def _checked(value: Any, dtype: int) -> float:
    """A scalar that PyTorch's kernel converts to ``dtype`` with a check
    (``Scalar::to``), which raises for a finite value beyond the dtype's range where a
    cast would give an infinity: Decline for one, so that PyTorch raises."""
    number = _number(value)
    largest = _LARGEST.get(dtype)
    if largest is not None and abs(number) > largest and not math.isinf(number):
        raise Decline
    return number


def _param_bits(value: Any) -> int:
    """An op's parameter (alpha, beta...) that PyTorch's kernel converts with a check to
    float32, the type it computes in for every dtype here."""
    return P.f32_bits(_checked(value, D.F32))


def _dtype_of(t: Any) -> int:
    if not isinstance(t, Tensor):
        raise Decline
    return dtype_code(t.dtype)


# ------------------------------------------------------------------ unary ops
def unary(name: str, mode: int) -> Handler:
    op = _OP[name]

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        if len(args) != 1:
            raise Decline
        _params(args, kwargs, (), 1)
        return pointwise(batch, op, args[0], target=_target(args, kwargs, mode))

    return handle


def gelu(mode: int) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        (approximate,) = _params(args, kwargs, (("approximate", "none"),), 1)
        if approximate not in ("none", "tanh"):
            raise Decline
        op = _OP["gelu_tanh" if approximate == "tanh" else "gelu"]
        return pointwise(batch, op, args[0], target=_target(args, kwargs, mode))

    return handle


def softplus(mode: int) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        beta, threshold = _params(args, kwargs, (("beta", 1), ("threshold", 20)), 1)
        return pointwise(
            batch,
            _OP["softplus"],
            args[0],
            p0=_param_bits(beta),
            p1=_param_bits(threshold),
            target=_target(args, kwargs, mode),
        )

    return handle


def elu(mode: int) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        spec = (("alpha", 1), ("scale", 1), ("input_scale", 1))
        alpha, scale, input_scale = _params(args, kwargs, spec, 1)
        negcoef = P.as_f32(P.as_f32(_checked(alpha, D.F32)) * P.as_f32(_checked(scale, D.F32)))
        return pointwise(
            batch,
            _OP["elu"],
            args[0],
            p0=P.f32_bits(negcoef),
            p1=_param_bits(scale),
            p2=_param_bits(input_scale),
            target=_target(args, kwargs, mode),
        )

    return handle


def celu(mode: int) -> Handler:
    """celu(x, alpha) is elu(x, alpha, 1, 1 / alpha), as PyTorch computes it."""

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        (alpha,) = _params(args, kwargs, (("alpha", 1),), 1)
        value = _checked(alpha, D.F32)
        if value == 0:
            raise Decline  # PyTorch raises
        return pointwise(
            batch,
            _OP["elu"],
            args[0],
            p0=P.f32_bits(value),
            p1=P.f32_bits(1.0),
            p2=P.f32_bits(1.0 / value),
            target=_target(args, kwargs, mode),
        )

    return handle


def leaky_relu(mode: int) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        (slope,) = _params(args, kwargs, (("negative_slope", 0.01),), 1)
        return pointwise(
            batch,
            _OP["leaky_relu"],
            args[0],
            p0=_param_bits(slope),
            target=_target(args, kwargs, mode),
        )

    return handle


def _bound(value: Any, dtype: int, missing: float) -> int:
    """A clamp bound as the tensor's dtype holds it (PyTorch converts it to that first,
    with a check)."""
    if value is None:
        return P.f32_bits(missing)
    return P.f32_bits(D.scalar_as(_checked(value, dtype), dtype))


def clamp(kind: str, mode: int) -> Handler:
    """clamp (min and/or max), clamp_min, clamp_max, hardtanh: scalar bounds."""
    spec = {
        "clamp": (("min", None), ("max", None)),
        "hardtanh": (("min_val", -1), ("max_val", 1)),
        "clamp_min": (("min", None),),
        "clamp_max": (("max", None),),
    }[kind]

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        values = _params(args, kwargs, spec, 1)
        low, high = (values[0], None) if kind == "clamp_min" else (None, values[0])
        if len(values) == 2:
            low, high = values
        if low is None and high is None:
            raise Decline  # PyTorch raises
        if any(type(bound) is float and math.isnan(bound) for bound in (low, high)):
            raise Decline  # PyTorch's NaN bound fills the result with NaN
        dtype = _dtype_of(args[0])
        return pointwise(
            batch,
            _OP["clamp"],
            args[0],
            p0=_bound(low, dtype, -math.inf),
            p1=_bound(high, dtype, math.inf),
            target=_target(args, kwargs, mode),
        )

    return handle


def clamp_tensor(kind: str, mode: int) -> Handler:
    """clamp / clamp_min / clamp_max with tensor bounds."""

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        if kind == "clamp":
            low, high = _params(args, kwargs, (("min", None), ("max", None)), 1)
        elif kind == "clamp_min":
            (low,), high = _params(args, kwargs, (("min", None),), 1), None
        else:
            low, (high,) = None, _params(args, kwargs, (("max", None),), 1)
        target = _target(args, kwargs, mode)
        if isinstance(low, Tensor) and isinstance(high, Tensor):
            return pointwise(batch, _OP["clamp_tensor"], args[0], low, high, target=target)
        if isinstance(low, Tensor) and high is None:
            return pointwise(batch, _OP["maximum"], args[0], low, target=target)
        if isinstance(high, Tensor) and low is None:
            return pointwise(batch, _OP["minimum"], args[0], high, target=target)
        raise Decline

    return handle


def pow_scalar(mode: int) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        (exponent,) = _params(args, kwargs, (("exponent", None),), 1)
        return pointwise(
            batch,
            _OP["pow_scalar"],
            args[0],
            p0=_bits(exponent),
            target=_target(args, kwargs, mode),
        )

    return handle


def rpow_scalar(mode: int) -> Handler:
    """pow.Scalar: a Python base to a tensor's powers."""

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        if len(args) != 2:
            raise Decline
        _params(args, kwargs, (("exponent", None),), 1)
        base = _bits(args[0])
        target = _target(args, kwargs, mode)
        # PyTorch gives this op a contiguous result whatever the exponents' layout.
        return pointwise(
            batch, _OP["rpow_scalar"], args[1], p0=base, target=target, contiguous=target is None
        )

    return handle


# ----------------------------------------------------------------- binary ops
def add(sign: float, reverse: bool, mode: int) -> Handler:
    """add / sub (sign -1) / rsub (reverse): ``a + sign * alpha * b``."""

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        other, alpha = _params(args, kwargs, (("other", None), ("alpha", 1)), 1)
        if type(alpha) is bool or (sign < 0 and type(other) is bool):
            raise Decline  # PyTorch refuses a bool alpha for numbers, and a bool subtracted
        # (CUDA's kernel converts alpha to float32 for float16 and bfloat16 too.)
        alpha_bits = P.f32_bits(sign * _checked(alpha, D.F32))
        target = _target(args, kwargs, mode)
        if reverse:  # rsub: other - alpha * self
            return pointwise(batch, _OP["add"], other, args[0], p0=alpha_bits, target=target)
        return pointwise(batch, _OP["add"], args[0], other, p0=alpha_bits, target=target)

    return handle


def binary(name: str, mode: int, rule: int = PROMOTE) -> Handler:
    op = _OP[name]

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        (other,) = _params(args, kwargs, (("other", None),), 1)
        if other is None:
            raise Decline
        return pointwise(batch, op, args[0], other, rule=rule, target=_target(args, kwargs, mode))

    return handle


def pow_tensor(mode: int) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        (exponent,) = _params(args, kwargs, (("exponent", None),), 1)
        if not isinstance(exponent, Tensor):
            raise Decline
        return pointwise(batch, _OP["pow"], args[0], exponent, target=_target(args, kwargs, mode))

    return handle


def _reciprocal(value: float) -> float:
    """1 / value in float32, as the kernels compute it (inf for a zero divisor)."""
    divisor = P.as_f32(value)
    if divisor == 0.0:
        return math.copysign(math.inf, divisor)
    return P.as_f32(1.0 / divisor)


def div(mode: int, with_mode: bool) -> Handler:
    """div with rounding_mode None, "trunc" or "floor". Dividing by a Python scalar
    multiplies by its float32 reciprocal, as PyTorch's CUDA kernels do."""

    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        spec: tuple[tuple[str, Any], ...] = (("other", None),)
        if with_mode:
            spec += (("rounding_mode", None),)
        values = _params(args, kwargs, spec, 1)
        other = values[0]
        rounding = values[1] if with_mode else None
        target = _target(args, kwargs, mode)
        if rounding not in (None, "trunc", "floor") or other is None:
            raise Decline
        if isinstance(other, Tensor):
            name = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}[rounding]
            return pointwise(batch, _OP[name], args[0], other, target=target)
        inverse = _reciprocal(_number(other))
        if rounding is None:
            return pointwise(batch, _OP["mul"], args[0], inverse, target=target)
        name = "div_trunc" if rounding == "trunc" else "div_floor"
        return pointwise(batch, _OP[name], args[0], other, p1=P.f32_bits(inverse), target=target)

    return handle


def where(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    if len(args) != 3 or kwargs:
        raise Decline
    cond, a, b = args
    if not isinstance(cond, Tensor):
        raise Decline
    return pointwise(batch, _OP["where"], a, b, cond)


# ---------------------------------------------------------------------- casts
_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def to_copy(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    spec = (
        ("dtype", None),
        ("layout", None),
        ("device", None),
        ("pin_memory", None),
        ("non_blocking", False),
        ("memory_format", None),
    )
    if len(args) != 1:
        raise Decline
    dtype, layout, device, pin_memory, _non_blocking, memory_format = _params(args, kwargs, spec, 1)
    x = args[0]
    if not isinstance(x, Tensor) or layout not in (None, torch.strided) or pin_memory:
        raise Decline
    if device is not None and torch.device(device) != x.device:
        raise Decline
    if memory_format not in _FORMATS:
        raise Decline
    target_dtype = dtype_code(x.dtype if dtype is None else dtype)
    return pointwise(
        batch,
        _OP["copy"],
        x,
        rule=target_dtype,
        contiguous=memory_format is torch.contiguous_format,
    )


def clone(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    if len(args) != 1:
        raise Decline
    (memory_format,) = _params(args, kwargs, (("memory_format", None),), 1)
    if memory_format not in _FORMATS:
        raise Decline
    x = args[0]
    return pointwise(
        batch,
        _OP["copy"],
        x,
        rule=_dtype_of(x),
        contiguous=memory_format is torch.contiguous_format,
    )


def copy_(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    src, _non_blocking = _params(args, kwargs, (("src", None), ("non_blocking", False)), 1)
    target = args[0]
    if not isinstance(src, Tensor) or not isinstance(target, Tensor):
        raise Decline
    return pointwise(
        batch, _OP["copy"], src, rule=_dtype_of(target), target=target, onto_target=True
    )


# ------------------------------------------------------------------ reductions
def reduction(op: int, overload: str) -> Handler:
    def handle(batch: Batch, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        if overload == "default" and op != P.REDUCE_AMAX:  # sum(x), mean(x): every dim
            (dtype,) = _params(args, kwargs, (("dtype", None),), 1)
            dims: Any = None
            keepdim: Any = False
        elif op == P.REDUCE_AMAX:
            dims, keepdim = _params(args, kwargs, (("dim", ()), ("keepdim", False)), 1)
            dtype = None
        else:
            spec = (("dim", None), ("keepdim", False), ("dtype", None))
            dims, keepdim, dtype = _params(args, kwargs, spec, 1)
            if dims is None:
                raise Decline
        if dtype is not None and dtype != getattr(args[0], "dtype", None):
            raise Decline
        return reduce(batch, op, args[0], dims, keepdim)

    return handle


# ----------------------------------------------------------------------- table
_UNARY = (
    "neg",
    "abs",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "silu",
    "hardsigmoid",
    "hardswish",
    "log1p",
    "expm1",
    "erf",
    "floor",
    "ceil",
    "trunc",
)


def _overloads(packet: str) -> Any:
    return getattr(torch.ops.aten, packet, None)


def build_table() -> dict[Any, Handler]:
    """Every supported aten overload (those this PyTorch has) with its handler."""
    table: dict[Any, Handler] = {}

    def put(packet: str, overload: str, handler: Handler) -> None:
        ops = _overloads(packet)
        if ops is not None and overload in ops.overloads():
            table[getattr(ops, overload)] = handler

    def family(name: str, make: Callable[[int], Handler], overload: str = "default") -> None:
        put(name, overload, make(FUNCTIONAL))
        put(name + "_", overload, make(INPLACE))
        put(name, "out", make(OUT))

    for name in _UNARY:
        family(name, partial(unary, name))
    put("round", "default", unary("round", FUNCTIONAL))
    put("round_", "default", unary("round", INPLACE))
    put("round", "out", unary("round", OUT))
    family("gelu", gelu)
    family("softplus", softplus)
    family("elu", elu)
    family("leaky_relu", leaky_relu)
    family("celu", celu)
    for kind in ("clamp", "hardtanh", "clamp_min", "clamp_max"):
        family(kind, partial(clamp, kind))
    for kind in ("clamp", "clamp_min", "clamp_max"):
        put(kind, "Tensor", clamp_tensor(kind, FUNCTIONAL))
        put(kind + "_", "Tensor", clamp_tensor(kind, INPLACE))
        put(kind, "Tensor_out", clamp_tensor(kind, OUT))
    put("pow", "Tensor_Scalar", pow_scalar(FUNCTIONAL))
    put("pow_", "Scalar", pow_scalar(INPLACE))
    put("pow", "Tensor_Scalar_out", pow_scalar(OUT))
    put("pow", "Tensor_Tensor", pow_tensor(FUNCTIONAL))
    put("pow_", "Tensor", pow_tensor(INPLACE))
    put("pow", "Tensor_Tensor_out", pow_tensor(OUT))
    put("pow", "Scalar", rpow_scalar(FUNCTIONAL))
    put("pow", "Scalar_out", rpow_scalar(OUT))

    for name, sign, reverse in (("add", 1.0, False), ("sub", -1.0, False), ("rsub", -1.0, True)):
        for overload in ("Tensor", "Scalar"):
            put(name, overload, add(sign, reverse, FUNCTIONAL))
            if not reverse:
                put(name + "_", overload, add(sign, reverse, INPLACE))
        if not reverse:
            put(name, "out", add(sign, reverse, OUT))
    for overload in ("Tensor", "Scalar"):
        put("mul", overload, binary("mul", FUNCTIONAL))
        put("mul_", overload, binary("mul", INPLACE))
    put("mul", "out", binary("mul", OUT))
    for name in ("maximum", "minimum"):
        put(name, "default", binary(name, FUNCTIONAL))
        put(name, "out", binary(name, OUT))
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        for overload in ("Tensor", "Scalar"):
            put(name, overload, binary(name, FUNCTIONAL, COMPARE))
            put(name, overload + "_out", binary(name, OUT, COMPARE))
    for overload, with_mode in (("Tensor", False), ("Scalar", False)):
        put("div", overload, div(FUNCTIONAL, with_mode))
        put("div_", overload, div(INPLACE, with_mode))
    for overload in ("Tensor_mode", "Scalar_mode"):
        put("div", overload, div(FUNCTIONAL, True))
        put("div_", overload, div(INPLACE, True))
    put("div", "out", div(OUT, False))
    put("div", "out_mode", div(OUT, True))
    for overload in ("self", "ScalarSelf", "ScalarOther"):
        put("where", overload, where)

    put("_to_copy", "default", to_copy)
    put("clone", "default", clone)
    put("copy_", "default", copy_)
    put("sum", "dim_IntList", reduction(P.REDUCE_SUM, "dim_IntList"))
    put("sum", "default", reduction(P.REDUCE_SUM, "default"))
    put("mean", "dim", reduction(P.REDUCE_MEAN, "dim"))
    put("mean", "default", reduction(P.REDUCE_MEAN, "default"))
    put("amax", "default", reduction(P.REDUCE_AMAX, "default"))
    return table


TABLE = build_table()


def build_usual() -> dict[Any, tuple[int, int, int, int, bool]]:
    """The overloads whose plain calls (positional tensors, a Python scalar second, no
    keyword) need nothing of their handler: ``(opcode, p0, rule, arity, tensors_only)``
    for the scheduler to record at once (``record.usual``); ``tensors_only``: a scalar
    second operand takes the handler. So division takes only a tensor here: a scalar
    divisor becomes a multiplication by its reciprocal, in its handler."""
    aten = torch.ops.aten
    one, minus_one = P.f32_bits(1.0), P.f32_bits(-1.0)
    table: dict[Any, tuple[int, int, int, int, bool]] = {}
    for name in (*_UNARY, "round", "gelu"):
        table[getattr(aten, name).default] = (_OP[name], 0, PROMOTE, 1, False)
    table[aten.add.Tensor] = (_OP["add"], one, PROMOTE, 2, False)
    table[aten.sub.Tensor] = (_OP["add"], minus_one, PROMOTE, 2, False)
    table[aten.mul.Tensor] = (_OP["mul"], 0, PROMOTE, 2, False)
    table[aten.div.Tensor] = (_OP["div"], 0, PROMOTE, 2, True)
    table[aten.maximum.default] = (_OP["maximum"], 0, PROMOTE, 2, True)
    table[aten.minimum.default] = (_OP["minimum"], 0, PROMOTE, 2, True)
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        table[getattr(aten, name).Tensor] = (_OP[name], 0, COMPARE, 2, False)
        table[getattr(aten, name).Scalar] = (_OP[name], 0, COMPARE, 2, False)
    return table


USUAL = build_usual()
