"""Op signatures: what an engine op takes, declared once and checked twice.

An op is a CUDA C++ body with a declared signature (arrays with dtype,
direction and minimum length; typed scalars). The signature drives both the
generated device wrapper (codegen.py) and the host-side validation of every
``Enqueue`` before anything enters the ring.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuactors.engine.abi import MAX_ARGS
from gpuactors.messages import invalid_argument

# NumPy dtype name -> C++ type used in generated wrappers.
C_TYPES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "int8": "signed char",
    "uint8": "unsigned char",
    "int16": "short",
    "uint16": "unsigned short",
    "int32": "int",
    "uint32": "unsigned int",
    "int64": "long long",
    "uint64": "unsigned long long",
}

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names a parameter cannot take: what the op's body already sees (ctx, n), the engine's
# own namespace, and C++/CUDA keywords; names starting with "__" or "GPA_" are reserved
# too (the compiler's and the engine's macros).
_CPP_KEYWORDS = frozenset(
    re.findall(
        r"\S+",
        """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
        char16_t char32_t class co_await co_return co_yield compl concept const consteval
        constexpr constinit const_cast continue decltype default delete do double
        dynamic_cast else enum explicit export extern false float for friend goto if inline
        int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
        protected public register reinterpret_cast requires return short signed sizeof
        static static_assert static_cast struct switch template this thread_local throw true
        try typedef typeid typename union unsigned using virtual void volatile wchar_t while
        xor xor_eq""",
    )
)
_RESERVED = {"ctx", "n", "rank", "units", "gpa", "NULL", *_CPP_KEYWORDS}

Dtype = Literal[
    "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_argument(type(self).__name__, exc) from None


def _check_identifier(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a valid parameter name (a C identifier)")
    if name in _RESERVED or name.startswith(("__", "GPA_")):
        raise ValueError(
            f"{name!r} is reserved: the body sees ctx and n (and rank, units are kept), and "
            "C++ keywords, names starting with '__' or 'GPA_' and gpa are taken"
        )
    return name


class ArrayParam(_Frozen):
    """A device array argument. ``length`` is the minimum element count: "n" or a constant."""

    kind: Literal["array"] = "array"
    name: str
    dtype: Dtype
    direction: Literal["in", "out", "inout"] = "in"
    length: Literal["n"] | Annotated[int, Field(ge=0)] = "n"

    _check_name = field_validator("name")(classmethod(lambda cls, v: _check_identifier(v)))

    def required_length(self, n: int) -> int:
        return n if self.length == "n" else int(self.length)

    @property
    def c_type(self) -> str:
        """Element type as the op body sees it (``const`` for inputs)."""
        return ("const " if self.direction == "in" else "") + C_TYPES[self.dtype]

    def c_declaration(self) -> str:
        return f"{self.c_type}* __restrict__ {self.name}"


class ScalarParam(_Frozen):
    """A scalar argument passed by value in the task record."""

    kind: Literal["scalar"] = "scalar"
    name: str
    dtype: Dtype

    _check_name = field_validator("name")(classmethod(lambda cls, v: _check_identifier(v)))

    @property
    def c_type(self) -> str:
        return C_TYPES[self.dtype]

    def c_declaration(self) -> str:
        return f"{self.c_type} {self.name}"

    def to_bits(self, value: object) -> int:
        """The value's bytes as the record's 8-byte slot holds them (little-endian)."""
        np_value = np.array(value, dtype=self.dtype)  # raises on values the dtype cannot hold
        return int.from_bytes(np_value.tobytes().ljust(8, b"\0"), "little")


Param = Annotated[ArrayParam | ScalarParam, Field(discriminator="kind")]


class OpSpec(_Frozen):
    """An engine op: a name, a signature and a CUDA C++ body.

    The body runs once per block the task spans, with every thread of the
    block. It sees its parameters by name, ``n`` (the element count) and
    ``ctx`` (a ``gpa::TaskCtx``: ``ctx.rank``, ``ctx.units``, and the
    ``GPA_FOR_EACH(i)`` loop over this block's share of ``0..n``). It returns
    0 on success or a positive failure code (reported as ``TaskFailed``).
    ``multi_block=False`` keeps every task of this op on one block (for ops
    such as a reduction that need the whole task in one block).
    """

    name: str
    params: tuple[Param, ...] = ()
    body: str = Field(max_length=1 << 20)
    multi_block: bool = True
    version: int = Field(default=1, ge=1)

    _check_op_name = field_validator("name")(classmethod(lambda cls, v: _check_identifier(v)))

    @model_validator(mode="after")
    def _check_params(self) -> OpSpec:
        if len(self.params) > MAX_ARGS:
            raise ValueError(
                f"op {self.name!r} has {len(self.params)} params, the limit is {MAX_ARGS}"
            )
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"op {self.name!r} repeats a parameter name: {names}")
        return self

    @property
    def c_name(self) -> str:
        """Device-function name of this op's version inside an engine module."""
        return f"gpa_op_{self.name}_v{self.version}"


BUILTIN_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="fill",
        params=(
            ArrayParam(name="out", dtype="float32", direction="out"),
            ScalarParam(name="value", dtype="float32"),
        ),
        body="GPA_FOR_EACH(i) { out[i] = value; }\nreturn 0;",
    ),
    OpSpec(
        name="copy",
        params=(
            ArrayParam(name="dst", dtype="float32", direction="out"),
            ArrayParam(name="src", dtype="float32", direction="in"),
        ),
        body=(
            "GPA_FOR_EACH_4(i) {\n"
            "    float v[4];\n"
            "    GPA_EACH_OF_4(i, k, j) v[k] = src[j];\n"
            "    GPA_EACH_OF_4(i, k, j) dst[j] = v[k];\n"
            "}\n"
            "return 0;"
        ),
    ),
    OpSpec(
        name="axpy",
        params=(
            ArrayParam(name="y", dtype="float32", direction="inout"),
            ArrayParam(name="x", dtype="float32", direction="in"),
            ScalarParam(name="a", dtype="float32"),
        ),
        body=(
            "GPA_FOR_EACH_4(i) {\n"
            "    float xv[4], yv[4];\n"
            "    GPA_EACH_OF_4(i, k, j) { xv[k] = x[j]; yv[k] = y[j]; }\n"
            "    GPA_EACH_OF_4(i, k, j) y[j] = a * xv[k] + yv[k];\n"
            "}\n"
            "return 0;"
        ),
    ),
    OpSpec(
        name="sum",
        params=(
            ArrayParam(name="out", dtype="float32", direction="out", length=1),
            ArrayParam(name="x", dtype="float32", direction="in"),
        ),
        body=(
            "float acc = 0.0f;\n"
            "GPA_FOR_EACH_4(i) {\n"
            "    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
            "    GPA_EACH_OF_4(i, k, j) v[k] = x[j];\n"
            "    acc += (v[0] + v[1]) + (v[2] + v[3]);\n"
            "}\n"
            "acc = gpa::block_sum(acc);\n"
            "if (threadIdx.x == 0) out[0] = acc;\n"
            "return 0;"
        ),
        multi_block=False,
    ),
    OpSpec(
        name="byte_hist",  # adds the byte histogram of data[0..n) into out[0..256)
        params=(
            ArrayParam(name="out", dtype="uint32", direction="inout", length=256),
            ArrayParam(name="data", dtype="uint8"),
        ),
        body=(
            "__shared__ unsigned int counts[256];\n"
            "for (int b = threadIdx.x; b < 256; b += blockDim.x) counts[b] = 0;\n"
            "__syncthreads();\n"
            "GPA_FOR_EACH(i) { atomicAdd(&counts[data[i]], 1u); }\n"
            "__syncthreads();\n"
            "for (int b = threadIdx.x; b < 256; b += blockDim.x)\n"
            "    if (counts[b]) atomicAdd(&out[b], counts[b]);\n"
            "return 0;"
        ),
    ),
)
