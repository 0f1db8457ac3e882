"""Fields whose order matters take a tuple or a list, never a set or an iterator: an
op's parameters (the kernel reads its arguments by position), the libraries linked into
an op, a link's inputs (link order). Pydantic's own tuple would take a set, in whatever
order the set iterates."""

from __future__ import annotations

from typing import Any

import pytest

from gpuactors.engine import ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.messages import Enqueue, ReplaceOp
from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import NvrtcOpts
from gpuactors.nvrtc.linker import LinkInput
from gpuactors.nvrtc.messages import Link

PARAMS = (
    ArrayParam(name="out", dtype="float32", direction="inout"),
    ScalarParam(name="factor", dtype="float32"),
)
BODY = "GPA_FOR_EACH(i) { out[i] = out[i] * factor; }\nreturn 0;"


@pytest.mark.parametrize("unordered", [set(PARAMS), frozenset(PARAMS), iter(PARAMS)])
def test_an_ops_parameters_in_no_order_are_refused(unordered: Any) -> None:
    with pytest.raises(InvalidArgument, match="params must be a tuple or a list, not"):
        OpSpec(name="scale", params=unordered, body=BODY)
    with pytest.raises(InvalidArgument, match="params must be a tuple or a list, not"):
        ReplaceOp(name="scale", params=unordered, body=BODY)


def test_parameters_as_a_tuple_or_a_list_keep_their_order() -> None:
    for given in (PARAMS, list(PARAMS)):
        assert OpSpec(name="scale", params=given, body=BODY).params == PARAMS
        assert ReplaceOp(name="scale", params=given, body=BODY).params == PARAMS
    assert ReplaceOp(name="scale", body=BODY).params is None  # (keeps the current ones)


def test_libraries_and_link_inputs_in_no_order_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="device_libraries must be a tuple or a list"):
        OpSpec(name="scale", params=PARAMS, body=BODY, device_libraries=set())
    listed = [LinkInput(name=name, kind="ptx", image=b".version 8.0\n") for name in "ab"]
    with pytest.raises(InvalidArgument, match="inputs must be a tuple or a list, not"):
        Link(inputs=iter(listed), kernel_names="apply")  # (inputs hold dicts: no set)
    assert Link(inputs=listed, kernel_names="apply").inputs == tuple(listed)


def test_a_tasks_arguments_of_none_are_named_in_the_error() -> None:
    with pytest.raises(InvalidArgument, match="args must be a tuple or a list, not NoneType"):
        Enqueue(op="fill", n=1, args=None)


@pytest.mark.parametrize("unordered", [{"/a", "/b"}, iter(["/a", "/b"])])
def test_include_paths_in_no_order_are_refused(unordered: Any) -> None:
    """The folders are searched in order; a set's order moves with the hash seed, and
    the cache key with it."""
    with pytest.raises(InvalidArgument, match="include_paths must be a path, or a tuple"):
        NvrtcOpts(include_paths=unordered)
    assert NvrtcOpts(include_paths=["/b", "/a"]).include_paths == ("/b", "/a")
