"""DLPack's C exchange API (``Tensor.__dlpack_c_exchange_api__``) while a scheduler context
is active: its C functions export a tensor with no Python call a hook could flush in, so
the hooks take it out and put the same object back when they come out (torch/hooks.py).
CPU PyTorch is enough: the reference executor runs the batches."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")

from gpuactors.torch import ReferenceExecutor, TorchScheduler  # noqa: E402
from torch_cases import hooks_taken_out  # noqa: E402

API = "__dlpack_c_exchange_api__"
EARLIER_NAME = "__c_dlpack_exchange_api__"  # before DLPack 1.3; torch-c-dlpack-ext's
NATIVE = vars(torch.Tensor).get(API)
needs_native = pytest.mark.skipif(NATIVE is None, reason="this PyTorch has no C exchange API")


@pytest.fixture
def sched() -> Iterator[TorchScheduler]:
    scheduler = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


@pytest.fixture(autouse=True)
def hooks_out_around() -> Iterator[None]:
    """Each test starts and ends with PyTorch's own attributes."""
    hooks_taken_out()
    yield
    hooks_taken_out()


def hidden() -> bool:
    """Whether a consumer looking the API up on the type (as the spec says) finds none."""
    return not any(hasattr(kind, API) for kind in (torch.Tensor, torch.nn.Parameter))


# ------------------------------------------------- a consumer of the C functions
class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", ctypes.c_int32 * 2),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_uint8 * 4),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [
    ("version", _Version),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", _DLTensor),
]
# PYFUNCTYPE: the producer's function may set a Python error, so it runs holding the GIL.
_FROM_PY_OBJECT = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.POINTER(_Managed))
)


class _ExchangeAPI(ctypes.Structure):
    """DLPack 1.3's ``DLPackExchangeAPI`` up to the function a consumer exports with."""

    _fields_ = [
        ("version", _Version),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", _FROM_PY_OBJECT),
    ]


def _through_c_functions(capsule: Any, t: Any) -> list[float]:
    """A float32 tensor's values as a C consumer (TVM-FFI) reads them: no Python call."""
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    api = _ExchangeAPI.from_address(get_pointer(capsule, b"dlpack_exchange_api"))
    managed = ctypes.POINTER(_Managed)()
    assert api.managed_tensor_from_py_object_no_sync(t, ctypes.byref(managed)) == 0
    try:
        dl = managed.contents.dl_tensor
        assert dl.data is not None
        return list((ctypes.c_float * t.numel()).from_address(dl.data + dl.byte_offset))
    finally:
        managed.contents.deleter(managed)


def export_as_a_consumer_would(t: Any) -> list[float]:
    """The spec's consumer: the C functions where the type has them, else ``__dlpack__``."""
    capsule = getattr(type(t), API, None)
    if capsule is not None:
        return _through_c_functions(capsule, t)
    return np.from_dlpack(t).tolist()  # type: ignore[no-any-return]


@needs_native
def test_a_consumer_of_the_c_api_reads_a_pending_result_after_its_batch_ran(
    sched: TorchScheduler,
) -> None:
    """With the API in, a consumer read the result's memory before the batch wrote it,
    and nothing was flushed."""
    with torch.no_grad(), sched:
        pending = torch.full((4,), 7.0) * 3
        seen = export_as_a_consumer_would(pending)
        assert sched.stats.flushes == {"dlpack": 1}
    assert seen == [21.0] * 4


# ------------------------------------------------- taken out, put back the same
@needs_native
def test_taken_out_in_repeated_and_nested_contexts_and_put_back_the_same_object() -> None:
    first, second = (TorchScheduler(ReferenceExecutor(), auto_flush_ms=None) for _ in range(2))
    try:
        for _ in range(3):
            with torch.no_grad(), first:
                assert hidden()
                with first:  # the same scheduler again
                    assert hidden()
                with second:  # another one inside
                    torch.ones(2) + 1
                    assert hidden()
                assert hidden()
            assert hidden()  # lingering between contexts, as the other hooks do
        hooks_taken_out()
        assert vars(torch.Tensor)[API] is NATIVE
        assert torch.nn.Parameter.__dlpack_c_exchange_api__ is NATIVE
    finally:
        first.close()
        second.close()


@needs_native
def test_put_back_after_an_exception_in_the_context(sched: TorchScheduler) -> None:
    with pytest.raises(RuntimeError, match="inside"), torch.no_grad(), sched:
        torch.ones(2) * 2
        assert hidden()
        raise RuntimeError("inside")
    hooks_taken_out()
    assert vars(torch.Tensor)[API] is NATIVE


@needs_native
def test_an_api_set_while_taken_out_is_kept_and_taken_out_at_the_next_context(
    sched: TorchScheduler,
) -> None:
    """TVM-FFI imported while the API is out sets its own (as for an older PyTorch): the
    hooks keep that one when they come out, as they keep any patch made over them."""
    libraries = object()
    try:
        with torch.no_grad(), sched:
            setattr(torch.Tensor, API, libraries)
        hooks_taken_out()
        assert vars(torch.Tensor)[API] is libraries
        with torch.no_grad(), sched:
            assert hidden()
        hooks_taken_out()
        assert vars(torch.Tensor)[API] is libraries
    finally:
        setattr(torch.Tensor, API, NATIVE)


def test_a_pytorch_without_the_api_is_left_without_it(sched: TorchScheduler) -> None:
    """An older PyTorch has no attribute to take out: the hooks add none and fail on none."""
    if NATIVE is not None:
        delattr(torch.Tensor, API)
    try:
        with torch.no_grad(), sched:
            assert hidden()
            y = torch.ones(3) * 2
        hooks_taken_out()
        assert API not in vars(torch.Tensor) and EARLIER_NAME not in vars(torch.Tensor)
        assert y.tolist() == [2.0, 2.0, 2.0]
    finally:
        if NATIVE is not None:
            setattr(torch.Tensor, API, NATIVE)


def test_the_earlier_name_a_library_set_is_taken_out_and_put_back(
    sched: TorchScheduler,
) -> None:
    """``torch-c-dlpack-ext`` sets ``__c_dlpack_exchange_api__`` on an older PyTorch, where
    an older TVM-FFI looks it up."""
    libraries = object()
    setattr(torch.Tensor, EARLIER_NAME, libraries)
    try:
        with torch.no_grad(), sched:
            assert not hasattr(torch.Tensor, EARLIER_NAME)
        hooks_taken_out()
        assert vars(torch.Tensor)[EARLIER_NAME] is libraries
    finally:
        delattr(torch.Tensor, EARLIER_NAME)
