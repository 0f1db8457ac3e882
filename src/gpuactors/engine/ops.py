"""Op signatures: what an engine op takes, declared once and checked twice.

An op is a CUDA C++ body with a declared signature (arrays with dtype,
direction and minimum length; typed scalars). The signature drives both the
generated device wrapper (codegen.py) and the host-side validation of every
``Enqueue`` before anything enters the ring.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, SupportsIndex

import numpy as np
from pydantic import Field, field_validator, model_validator

from gpuactors.checked import CheckedModel
from gpuactors.engine.abi import MAX_ARGS
from gpuactors.errors import InvalidArgument
from gpuactors.messages import Accepts, Flag, InOrder, WholeNumber
from gpuactors.nvrtc.handle import KernelHandle
from gpuactors.nvrtc.linker import LinkInput
from gpuactors.nvrtc.module import CompiledModule
from gpuactors.nvrtc.text import check_no_nul

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

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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


def _check_identifier(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):  # (match's "$" would let a trailing newline in)
        raise ValueError(f"{name!r} is not a valid parameter name (a C identifier)")
    if name in _RESERVED or name.startswith(("__", "GPA_")):
        raise ValueError(
            f"{name!r} is reserved: the body sees ctx and n (and rank, units are kept), and "
            "C++ keywords, names starting with '__' or 'GPA_' and gpa are taken"
        )
    return name


#: What a parameter's name may not start with, beyond :func:`_check_identifier`'s rule
#: (which op names keep: theirs only appear inside gpa_op_<name>_v<version>). A parameter
#: is named in the wrapper's own scope, where such a name would break the module or hide
#: the parameter: "_" and a capital is reserved to the compiler (``_Pragma`` is an
#: operator); NVRTC predefines object-like macros (``CUDART_VERSION``,
#: ``CUDA_IPC_HANDLE_SIZE``, ``NV_IS_DEVICE``, ``cudaStreamLegacy``...) that would replace
#: the name; ``gpa_`` names the wrapper's locals (``gpa_body_scope``: a clash read as a
#: body leaving its function) and ``_gpa`` those of ``GPA_FOR_EACH``, which would hide a
#: parameter of that name inside the loop.
_PARAM_RESERVED_PREFIX = re.compile(r"_[A-Z]|_gpa|gpa_|CUDA|CU_|NV_|cuda[A-Z]")


def _check_param_name(name: str) -> str:
    _check_identifier(name)
    if _PARAM_RESERVED_PREFIX.match(name):
        raise ValueError(
            f"{name!r} is reserved: a parameter name may not start with '_' and a capital, "
            "'_gpa', 'gpa_' (the compiler's and the engine's), 'CUDA', 'CU_', 'NV_' or "
            "'cuda' and a capital (macros NVRTC defines)"
        )
    return name


#: The name of the engine's own check that a body stays inside its function (codegen.py).
BODY_SCOPE_GUARD = "gpa_body_scope"
#: Line splices. NVRTC joins lines only where the newline follows the backslash at once;
#: the search for spellings joins those with blanks between too, so none is missed.
_SPLICE = re.compile(r"\\[ \t\v\f\r]*\n")
#: The one directive a body may hold, alone on its line (no splice in or out of it):
#: ``#pragma unroll`` [count].
_UNROLL = re.compile(r"[ \t\v\f\r]*#[ \t]*pragma[ \t]+unroll([ \t]+[0-9]+)?[ \t\v\f\r]*")
#: Spellings a body may not hold anywhere (a plain substring test: quick, and a name
#: that merely contains one is refused too), and why.
_FORBIDDEN = {
    "%:": "'%:' is the digraph of '#' (a preprocessor directive)",
    "_Pragma": "_Pragma is a #pragma in operator form",
    "__pragma": "__pragma is a #pragma in operator form",
    "__global__": "an op body is the body of a device function and declares no kernel",
    BODY_SCOPE_GUARD: f"{BODY_SCOPE_GUARD} is the engine's check that a body stays in its function",
}


def check_body(body: str, op: str) -> str:
    """Return ``body``, or raise InvalidArgument if op ``op`` cannot use it.

    Every op's body is pasted into ONE engine module, after the others and before the
    engine's own code, so a body must not change how anything else compiles:

    * No NUL: NVRTC reads the source as a C string and silently drops everything after
      one (the rest of the module, the engine kernel included).
    * No preprocessor directive but ``#pragma unroll [count]`` alone on its line. A
      ``#define`` would change every later op and the engine's code (``#undef`` after
      the body cannot restore a macro it redefined, and push/pop_macro only works for
      names known in advance); a ``#pragma`` could silence the diagnostics the module
      makes errors (a body that can end without a return); ``#if`` could hide code from
      any check. ``_Pragma``, ``__pragma`` and the ``%:`` digraph are the same things
      spelled otherwise. Telling a directive from a '#' in a comment or a string would
      take a C++ lexer, so a '#' anywhere is refused: a refusal costs a rewording, a
      miss costs every other op. A constant is a ``constexpr``, a helper a lambda.
    * No ``__global__``: an op is a device function, not a kernel.
    * A body that closes its function early (an unmatched ``}``) is stopped by the
      compiler: see ``codegen.py``'s scope guard, whose name is reserved here.

    Op bodies are trusted code (they run on the device with its full power): these
    rules keep one op from changing others by accident, they are not a sandbox.
    """
    return check_code(body, f"op {op!r}: the body")


def check_code(code: str, where: str) -> str:
    """Return ``code``, or raise InvalidArgument (its message starts with ``where``)
    unless it keeps :func:`check_body`'s rules: text pasted into the one engine module
    (an op's body, a device library's declarations) must not change how the rest of
    the module compiles."""
    check_no_nul(code, where)
    joined = _SPLICE.sub("", code)
    for spelling, why in _FORBIDDEN.items():
        if spelling in joined:
            raise InvalidArgument(f"{where} may not hold {spelling!r}: {why}")
    # Lines as written: an allowed line holds no backslash, so no splice can extend it,
    # and one that a splice prefixes with anything but blanks is no directive.
    for line in code.split("\n") if "#" in code else ():
        if "#" in line and not _UNROLL.fullmatch(line):
            raise InvalidArgument(
                f"{where} holds a '#' ({line.strip()[:60]!r}): it may hold "
                "no preprocessor directive but '#pragma unroll [count]' on its own line, "
                "and no '#' in a comment or string either (see check_body)"
            )
    return code


#: A constant minimum length of an array parameter: below 2**62, as a task's ``n`` (a
#: batch adds it to offsets in int64).
_Length = Annotated[WholeNumber, Field(ge=0, lt=2**62)]


class ArrayParam(CheckedModel):
    """A device array argument. ``length`` is the minimum element count: "n" or a constant."""

    kind: Literal["array"] = "array"
    name: str
    dtype: Dtype
    direction: Literal["in", "out", "inout"] = "in"
    length: Accepts[Literal["n"] | _Length, SupportsIndex] = Accepts("n")

    _check_name = field_validator("name")(classmethod(lambda cls, v: _check_param_name(v)))

    def required_length(self, n: int) -> int:
        return n if self.length == "n" else int(self.length)

    @property
    def c_type(self) -> str:
        """Element type as the op body sees it (``const`` for inputs)."""
        return ("const " if self.direction == "in" else "") + C_TYPES[self.dtype]

    def c_declaration(self) -> str:
        return f"{self.c_type}* __restrict__ {self.name}"


class ScalarParam(CheckedModel):
    """A scalar argument passed by value in the task record."""

    kind: Literal["scalar"] = "scalar"
    name: str
    dtype: Dtype

    _check_name = field_validator("name")(classmethod(lambda cls, v: _check_param_name(v)))

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


class DeviceLibrary(CheckedModel):
    """Device code compiled apart that op bodies call: an image to link into the engine
    module and the ``declarations`` those bodies need (``extern "C" __device__ float
    f(float);``), pasted once at file scope before the ops.

    ``image`` is a :class:`~gpuactors.nvrtc.LinkInput` (LTO-IR, or a relocatable CUBIN,
    PTX, object, fatbin or library archive), or a :class:`~gpuactors.nvrtc.KernelHandle`
    or :class:`~gpuactors.nvrtc.CompiledModule` of a compile with ``relocatable=True``.
    The declarations follow :func:`check_body`'s rules (no '#', so no include guard:
    each library's declarations are pasted once).
    """

    image: Accepts[LinkInput, CompiledModule | KernelHandle]
    declarations: str = Field(default="", max_length=1 << 20)

    @field_validator("image", mode="before")
    @classmethod
    def _image_of(cls, value: object) -> object:
        module = getattr(value, "module", value)  # a KernelHandle holds its module
        return LinkInput.of(module) if isinstance(module, CompiledModule) else value

    @model_validator(mode="after")
    def _check_declarations(self) -> DeviceLibrary:
        check_code(self.declarations, f"device library {self.image.name!r}: its declarations")
        return self

    @property
    def name(self) -> str:
        return self.image.name


class OpSpec(CheckedModel):
    """An engine op: a name, a signature and a CUDA C++ body.

    The body runs once per block the task spans, with every thread of the
    block. It sees its parameters by name, ``n`` (the element count) and
    ``ctx`` (a ``gpa::TaskCtx``: ``ctx.rank``, ``ctx.units``, and the
    ``GPA_FOR_EACH(i)`` loop over this block's share of ``0..n``). It returns
    0 on success or a positive failure code (reported as ``TaskFailed``).
    ``multi_block=False`` keeps every task of this op on one block (for ops such
    as a reduction that need the whole task in one block). ``device_libraries``
    lets the body call functions compiled apart (each :class:`DeviceLibrary` is
    linked into the engine module). What a body may not hold (a NUL, preprocessor
    directives, ``__global__``...): :func:`check_body`.
    """

    name: str
    params: Annotated[tuple[Param, ...], InOrder] = ()
    body: str = Field(max_length=1 << 20)
    multi_block: Flag = True
    version: Accepts[WholeNumber, SupportsIndex] = Field(default=Accepts(1), ge=1)
    #: Device code this op's body calls, linked into the engine module (see docs/linking.md).
    device_libraries: Annotated[tuple[DeviceLibrary, ...], InOrder] = ()

    _check_op_name = field_validator("name")(classmethod(lambda cls, v: _check_identifier(v)))

    @model_validator(mode="after")
    def _check_body(self) -> OpSpec:
        check_body(self.body, self.name)
        return self

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
