"""Fixes of the review of user input on its way to a GPU: op signatures (names, lengths,
versions) and the device arrays described through ``__cuda_array_interface__``.

Each test failed before its fix; none needs a GPU (arrays here are host memory that
says it lives on device 0, as in fake_engines.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuactors.cuda.arrays import describe_array
from gpuactors.engine.args import ArgEncoder, encode_batch
from gpuactors.engine.messages import EnqueueBatch
from gpuactors.engine.ops import ArrayParam, OpSpec, ScalarParam
from gpuactors.errors import InvalidArgument

POINTER = 0x7F00_0000_0000  # any aligned address: device 0 is named, never asked


class Interface:
    """An object speaking ``__cuda_array_interface__`` (v3 unless told), on device 0."""

    def __init__(self, **fields: Any) -> None:
        self.__cuda_array_interface__ = {
            "shape": (4,),
            "typestr": "<f4",
            "data": (POINTER, False),
            "version": 3,
            **fields,
        }
        self.device = SimpleNamespace(id=0)


# ------------------------------------------------------------------ parameter names
@pytest.mark.parametrize(
    "name",
    [
        "_Pragma",  # the operator form of #pragma: the wrapper no longer parses
        "_Complex",  # "_" and a capital: reserved to the implementation
        "gpa_body_scope",  # the wrapper's own local (reported as a body ending its function)
        "_gpa_n",  # GPA_FOR_EACH's locals would hide the parameter inside the loop
        "_gpa_s",
        "CUDART_VERSION",  # macros NVRTC predefines: the parameter becomes their value
        "CUDA_IPC_HANDLE_SIZE",
        "cudaStreamLegacy",
        "NV_IS_DEVICE",
    ],
)
def test_parameter_names_that_break_or_hide_in_the_generated_module_are_refused(
    name: str,
) -> None:
    with pytest.raises(InvalidArgument, match="reserved"):
        ScalarParam(name=name, dtype="int32")
    with pytest.raises(InvalidArgument, match="reserved"):
        ArrayParam(name=name, dtype="float32")


@pytest.mark.parametrize("name", ["_", "_x", "x_", "cuda", "cudastream", "nv_scale", "gpa2"])
def test_parameter_names_near_the_reserved_ones_are_kept(name: str) -> None:
    assert ScalarParam(name=name, dtype="int32").name == name


def test_op_names_keep_their_rule() -> None:
    """An op's name only ever appears inside gpa_op_<name>_v<version> and a #line string:
    the parameters' extra prefixes do not apply to it."""
    assert OpSpec(name="cudaSaxpy", body="return 0;").c_name == "gpa_op_cudaSaxpy_v1"


# ------------------------------------------------------------ lengths and versions
@pytest.mark.parametrize("length", [True, False, 2.0, "5", 2**62, 2**70, -1, "m"])
def test_array_lengths_are_whole_numbers_below_the_largest_n(length: object) -> None:
    """A bool is a mistake, not 1 (the library's whole-number rule); a length no task's n
    can reach (n < 2**62) makes an op that can never run."""
    with pytest.raises(InvalidArgument, match="length"):
        ArrayParam(name="x", dtype="float32", length=length)


@pytest.mark.parametrize(
    ("length", "kept"), [("n", "n"), (0, 0), (np.int64(256), 256), (2**62 - 1, 2**62 - 1)]
)
def test_good_array_lengths_are_kept(length: object, kept: object) -> None:
    param = ArrayParam(name="x", dtype="float32", length=length)
    assert param.length == kept and type(param.length) is type(kept)


@pytest.mark.parametrize("version", [True, 2.0, "3"])
def test_op_versions_are_whole_numbers(version: object) -> None:
    """As AliasOp's version is: OpSpec(version=True) had been version 1."""
    with pytest.raises(InvalidArgument, match="version"):
        OpSpec(name="v", body="return 0;", version=version)
    assert OpSpec(name="v", body="return 0;", version=np.int32(3)).version == 3


# ------------------------------------------------------ __cuda_array_interface__
def test_a_masked_array_is_refused() -> None:
    """The op would read every element, the masked ones too."""
    with pytest.raises(InvalidArgument, match="mask"):
        describe_array(Interface(mask=Interface(typestr="|b1")), "argument 'x'")
    assert describe_array(Interface(mask=None)).size == 4


@pytest.mark.parametrize(
    "shape",
    [
        (-2, -3),  # read as 6 elements
        (-1,),
        (2.5,),  # read as 2
        (True,),
        (2**40, 2**40 + 1),  # NumPy's int64 product wrapped round to 2**40
        (2**63,),  # ... and to below 0
        (2**62,),  # 2**64 bytes of float32: more than the address space
    ],
)
def test_malformed_and_impossible_shapes_are_refused(shape: tuple[Any, ...]) -> None:
    with pytest.raises(InvalidArgument):
        describe_array(Interface(shape=shape), "argument 'x'")


def test_a_huge_array_is_never_large_enough_by_wrapping_round() -> None:
    op = OpSpec(name="one", params=(ArrayParam(name="x", dtype="float32"),), body="return 0;")
    with pytest.raises(InvalidArgument):
        ArgEncoder(op).encode((Interface(shape=(2**40, 2**40 + 1)),), 2**40, 0)


@pytest.mark.parametrize("data", [(1.5, False), (float(POINTER), False), ("0x10", False)])
def test_a_data_pointer_that_is_not_an_int_is_refused(data: tuple[Any, bool]) -> None:
    with pytest.raises(InvalidArgument, match="pointer"):
        describe_array(Interface(data=data), "argument 'x'")


def test_strides_that_do_not_match_the_shape_are_refused() -> None:
    """An empty tuple had been read as "no strides": C-contiguous."""
    with pytest.raises(InvalidArgument):
        describe_array(Interface(strides=()), "argument 'x'")
    assert describe_array(Interface(shape=(), strides=())).size == 1


@pytest.mark.parametrize(
    ("shape", "strides"), [((3, 0), (100, 4)), ((0,), (8,)), ((0, 5), (4, 40))]
)
def test_an_empty_array_is_contiguous_whatever_its_strides(
    shape: tuple[int, ...], strides: tuple[int, ...]
) -> None:
    """As NumPy and CuPy say of a zero-size array; a task of n=0 may take it."""
    info = describe_array(Interface(shape=shape, strides=strides, data=(0, False)))
    assert info.contiguous and info.size == 0
    fill = OpSpec(
        name="fill0",
        params=(ArrayParam(name="out", dtype="float32", direction="out"),),
        body="return 0;",
    )
    empty = Interface(shape=shape, strides=strides, data=(0, False))
    assert ArgEncoder(fill).encode((empty,), 0, 0) == [0]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_explicit_c_strides_of_every_interface_version_are_contiguous(version: int) -> None:
    """Versions 0 and 1 gave strides for C-contiguous arrays too; later ones may give None."""
    info = describe_array(Interface(shape=(2, 3), strides=(12, 4), version=version))
    assert info.contiguous and info.size == 6
    assert not describe_array(Interface(shape=(2, 3), strides=(4, 8), version=version)).contiguous


def test_a_big_endian_or_read_only_array_is_refused_where_it_is_used() -> None:
    """Checks that held before the review, kept here beside the new ones."""
    op = OpSpec(
        name="scale",
        params=(ArrayParam(name="y", dtype="float32", direction="inout"),),
        body="return 0;",
    )
    with pytest.raises(InvalidArgument, match="dtype float32"):
        ArgEncoder(op).encode((Interface(typestr=">f4"),), 4, 0)
    with pytest.raises(InvalidArgument, match="read-only"):
        ArgEncoder(op).encode((Interface(data=(POINTER, True)),), 4, 0)


def test_a_length_near_2_63_cannot_wrap_a_batch_round() -> None:
    """An offset plus a fixed length of 2**63 - 1 wrapped round in int64, so no task was
    found past the array's end: a bare IndexError. Such a length is refused now."""
    with pytest.raises(InvalidArgument):
        op = OpSpec(
            name="window",
            params=(ArrayParam(name="x", dtype="float32", length=2**63 - 1),),
            body="return 0;",
        )
        huge = Interface(shape=(2**63 - 1,))
        encode_batch(op, 0, EnqueueBatch(op="window", args=(huge,), offsets={"x": [1]}), 0)


@pytest.mark.parametrize(("typestr", "offset"), [("<f4", 2), ("<f8", 4), ("<i2", 1), ("<c8", 4)])
def test_an_array_whose_elements_are_not_aligned_is_refused(typestr: str, offset: int) -> None:
    """A device load from such an address faults the context (every task in flight)."""
    with pytest.raises(InvalidArgument, match="multiple"):
        describe_array(Interface(typestr=typestr, data=(POINTER + offset, False)), "argument 'x'")
    assert describe_array(Interface(typestr="|u1", data=(POINTER + 1, False))).ptr == POINTER + 1
    assert describe_array(Interface(typestr=typestr, data=(POINTER + 16, False))).size == 4
