"""The bool fields of NVRTC's options take True or False only (``Launch.timed`` too, in
test_nvrtc_actor): pydantic's lax bool had read "yes" and 1 as True, "no" and 0.0 as
False."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc import NvrtcOpts
from gpuactors.nvrtc.linker import LinkOpts

FLAGS: list[tuple[type[Any], str]] = [
    (NvrtcOpts, "fast_math"),
    (NvrtcOpts, "ftz"),
    (NvrtcOpts, "relocatable"),
    *((LinkOpts, field) for field in ("lto", "device_debug", "line_info", "ftz", "fma")),
]


@pytest.mark.parametrize(("model", "field"), FLAGS)
@pytest.mark.parametrize("value", ["yes", "no", 1, 0.0])
def test_an_option_flag_refuses_strings_and_numbers(
    model: type[Any], field: str, value: object
) -> None:
    with pytest.raises(InvalidArgument, match=f"{field} must be True or False"):
        model(**{field: value})


@pytest.mark.parametrize(("model", "field"), FLAGS)
def test_an_option_flag_takes_true_false_and_numpy_bools(model: type[Any], field: str) -> None:
    assert getattr(model(**{field: True}), field) is True
    assert getattr(model(**{field: np.False_}), field) is False
