"""What a dispatch mode does not see: ways to reach a tensor's memory that are no op.

A scheduler's ``TorchDispatchMode`` sees every aten op, and flushes its batch before an
op that may read what the batch writes. Some reads and writes never pass through it
(see :class:`TensorHooks`); while any scheduler context is active, the ``Tensor``
attributes and ``torch`` functions that make them are replaced by ones that flush the
batches they touch first (or taken out, where a replacement cannot flush), and put back
:data:`LINGER_S` after the last context ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.dlpack
from torch import Tensor

if TYPE_CHECKING:
    from gpuactors.torch.scheduler import TorchScheduler

_CONTAINERS = (list, tuple)
#: How long the hooks stay in after the last context ends, doing nothing but call
#: PyTorch's own attribute. Each replacement and each restoration changes the
#: ``Tensor`` type, which empties every cache of its attributes (the interpreter's
#: and PyTorch's), so a loop that enters a context per call would pay both per call.
LINGER_S = 0.1


class TensorHooks:
    """What a dispatch mode does not see, watched while a scheduler context is active:
    ``Tensor``'s attributes and ``torch``'s functions below are replaced when the first
    context is entered and put back when the last one ends.

    * Printing turns dispatch modes off (``torch._tensor_str``): ``__repr__`` flushes a
      batch the printed tensor may read first.
    * Other code reaches a tensor's memory with no op: other libraries through
      ``__cuda_array_interface__`` and ``__dlpack__`` (CuPy, an engine's ``Enqueue``)
      or DLPack's legacy ``torch.utils.dlpack.to_dlpack`` (``torch.to_dlpack``, a C
      function that calls no ``__dlpack__``), storage-level code through
      ``untyped_storage()`` (``torch.save``, sharing), and on the CPU ``numpy()`` and
      ``tolist()``. Each flushes a batch that reads or writes the tensor's memory first
      (the reader may also write it).
    * ``t.data = v`` is no op: it points ``t`` at ``v``'s memory and may free ``t``'s.
      A batch that cannot know it would take ``v``'s memory for dead once ``v`` is
      (dropping its store, giving it to a later result) and keep reading ``t``'s old
      memory, so ``data`` gets a setter that flushes a batch touching either.
    * ``torch.tensor([a, b])`` (and ``as_tensor``, ``asarray``, ``new_tensor``) reads
      each tensor of a list in C++ with dispatch modes set aside: those functions
      flush what the tensors in their data touch first.
    * ``Tensor.__dlpack_c_exchange_api__`` (recent PyTorch; DLPack 1.3's C exchange
      API, a capsule of C functions, ``__c_dlpack_exchange_api__`` before) lets a
      consumer (TVM-FFI) export a tensor with no Python call to flush in: it is taken
      out, so that a consumer looking it up falls back to ``__dlpack__`` or
      ``to_dlpack``. One that looked it up before (the spec lets a consumer keep it per
      type) is not seen (docs/torch.md).

    The replacements go in when the first context is entered and come out
    :data:`LINGER_S` after the last one ended (a thread of this object's takes them
    out), so that contexts entered one after another keep them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[TorchScheduler] = []
        #: (owner, name) -> the owner's own attribute before the hooks (None: it had none)
        self._originals: dict[tuple[Any, str], Any] = {}
        self._installed = False
        self._last_left = 0.0  # when the last context ended (time.monotonic)
        self._remover: threading.Thread | None = None

    def activate(self, scheduler: TorchScheduler) -> None:
        with self._lock:
            for (owner, name), replacement in _REPLACEMENTS.items():
                current = vars(owner).get(name)
                if not self._installed or current is not replacement:
                    # Not in yet, or another patch went over it since (a library's,
                    # made while the hooks were in): that one is the original now.
                    self._originals[owner, name] = current
                    _put(owner, name, replacement)
            self._installed = True
            self._active.append(scheduler)

    def deactivate(self, scheduler: TorchScheduler) -> None:
        with self._lock:
            self._active.remove(scheduler)
            if self._active:
                return
            self._last_left = time.monotonic()
            self._remove_later()

    def _remove_later(self) -> None:
        """(Lock held.) Have a thread take the replacements out once idle."""
        if self._remover is None:
            self._remover = threading.Thread(
                target=self._remove_when_idle, daemon=True, name="torch-hooks"
            )
            self._remover.start()

    def after_fork_in_child(self) -> None:
        """A forked child has none of the parent's threads, and may have been forked
        while one of them held the lock."""
        self._lock = threading.Lock()
        self._remover = None
        if self._installed and not self._active:
            with self._lock:
                self._remove_later()

    def installed(self) -> bool:
        """Whether the replacements are in (while a context is active, and shortly after)."""
        return self._installed

    def _remove_when_idle(self) -> None:
        """Take the replacements out once no context has been active for LINGER_S."""
        while True:
            with self._lock:
                wait = LINGER_S
                if not self._active:
                    wait = self._last_left + LINGER_S - time.monotonic()
                    if wait <= 0:
                        self._remove()
                        self._remover = None
                        return
            time.sleep(wait)

    def _remove(self) -> None:
        """Put the originals back where the replacements still are (a patch made over
        one since stays)."""
        for (owner, name), original in self._originals.items():
            if vars(owner).get(name) is not _REPLACEMENTS[owner, name]:
                continue
            _put(owner, name, original)
        self._originals.clear()
        self._installed = False

    def saved(self, owner: Any, name: str) -> Any:
        """``owner``'s own attribute ``name`` from before the hooks (None: it had none)."""
        return self._originals.get((owner, name))

    def _schedulers(self) -> list[TorchScheduler]:
        with self._lock:
            return list(self._active)

    def flush_for(self, reason: str, *tensors: Any) -> None:
        """Flush every active scheduler's batch that reads or writes ``tensors``' memory."""
        for scheduler in self._schedulers():
            scheduler.flush_touching(reason, *tensors)

    def others_active(self, scheduler: TorchScheduler) -> bool:
        """Whether a scheduler other than ``scheduler`` is in a context (on any thread)."""
        active = self._active
        return len(active) > 1 or (len(active) == 1 and active[0] is not scheduler)

    def others_open_here(self, scheduler: TorchScheduler) -> bool:
        """Whether this thread is inside the context of a scheduler besides ``scheduler``."""
        return any(other is not scheduler and other.open_here() for other in self._schedulers())

    def flush_others(self, scheduler: TorchScheduler) -> None:
        """Flush the batches of the other schedulers whose context this thread is in:
        ``scheduler`` is about to queue or run work that may read or write what they
        queued (nested contexts of two schedulers, or one scheduler's traced function
        called inside another's context)."""
        for other in self._schedulers():
            if other is not scheduler and other.open_here():
                other.flush("other scheduler")


def _put(owner: Any, name: str, value: Any) -> None:
    """Make ``value`` ``owner``'s own attribute ``name``; None: leave it none of its own
    (an attribute taken out, or one it never had, as in a PyTorch that lacks it)."""
    if value is not None:
        setattr(owner, name, value)
    elif name in vars(owner):
        delattr(owner, name)


HOOKS = TensorHooks()
os.register_at_fork(after_in_child=HOOKS.after_fork_in_child)
#: PyTorch's own attributes, as the replacements call them where their owner had none
#: of its own when they went in (``data``, ``untyped_storage``, ``numpy``, ``tolist``
#: and ``new_tensor`` live on ``Tensor``'s C base class). Where it had one (``__repr__``,
#: the two interfaces and ``torch``'s functions, or another library's patch of them),
#: the replacements call that.
_PYTORCH: dict[tuple[Any, str], Any] = {
    (Tensor, "__repr__"): Tensor.__repr__,
    (Tensor, "__dlpack__"): Tensor.__dlpack__,
    (torch, "to_dlpack"): torch.to_dlpack,
    (torch.utils.dlpack, "to_dlpack"): torch.utils.dlpack.to_dlpack,
    (Tensor, "__cuda_array_interface__"): Tensor.__dict__["__cuda_array_interface__"],
    (Tensor, "untyped_storage"): Tensor.untyped_storage,
    (Tensor, "numpy"): Tensor.numpy,
    (Tensor, "tolist"): Tensor.tolist,
    (Tensor, "data"): Tensor.data,
    (Tensor, "new_tensor"): Tensor.new_tensor,
    (torch, "tensor"): torch.tensor,
    (torch, "as_tensor"): torch.as_tensor,
    (torch, "asarray"): torch.asarray,
}


#: Per thread, the (owner, name) pairs whose original is being called.
_CALLING = threading.local()


def _through_original(owner: Any, name: str, use: Callable[[Any], Any]) -> Any:
    """``use(original)``, ``original`` being what ``owner.<name>`` was before the hooks
    went in. Asked again from inside that call (a patch made over the hooks that calls
    them back, having kept them as its own original), ``use`` gets PyTorch's own: the
    two never call each other forever."""
    key = (owner, name)
    calling: set[tuple[Any, str]] = _CALLING.__dict__.setdefault("keys", set())
    if key in calling:
        return use(_PYTORCH[key])
    saved = HOOKS.saved(owner, name)
    calling.add(key)
    try:
        return use(_PYTORCH[key] if saved is None else saved)
    finally:
        calling.discard(key)


def _flushing_repr(self: Tensor, *, tensor_contents: Any = None) -> str:
    HOOKS.flush_for("print", self)
    return _through_original(  # type: ignore[no-any-return]
        Tensor, "__repr__", lambda f: f(self, tensor_contents=tensor_contents)
    )


def _flushing_array_interface(self: Tensor) -> Any:
    HOOKS.flush_for("array interface", self)
    return _through_original(
        Tensor, "__cuda_array_interface__", lambda p: p.__get__(self, type(self))
    )


def _flushing(reason: str, name: str) -> Callable[..., Any]:
    """``Tensor.<name>`` (a method), after a flush of what its tensor touches."""

    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        HOOKS.flush_for(reason, self)
        return _through_original(Tensor, name, lambda f: f(self, *args, **kwargs))

    method.__name__ = name
    method.__doc__ = _PYTORCH[Tensor, name].__doc__
    return method


def _exporting(owner: Any, name: str) -> Callable[..., Any]:
    """``owner.<name>``, DLPack's legacy ``to_dlpack(data)``, after a flush of what its
    tensor touches: the capsule it returns hands the memory to a consumer we never see."""

    def function(*args: Any, **kwargs: Any) -> Any:
        HOOKS.flush_for("dlpack", args[0] if args else kwargs.get("data"))
        return _through_original(owner, name, lambda f: f(*args, **kwargs))

    function.__name__ = name
    function.__doc__ = _PYTORCH[owner, name].__doc__
    return function


def _from_data(owner: Any, name: str) -> Callable[..., Any]:
    """``owner.<name>`` (its first argument is data to copy, ``new_tensor``'s the second),
    after a flush of what the tensors in that data touch."""
    at = 1 if owner is Tensor else 0

    def function(*args: Any, **kwargs: Any) -> Any:
        data = args[at] if len(args) > at else kwargs.get("data", kwargs.get("obj"))
        if type(data) in _CONTAINERS:
            HOOKS.flush_for("tensor from data", *_tensors_in(data))
        return _through_original(owner, name, lambda f: f(*args, **kwargs))

    function.__name__ = name
    function.__doc__ = _PYTORCH[owner, name].__doc__
    return function


def _tensors_in(data: Any) -> list[Tensor]:
    """The tensors in nested lists and tuples (numbers are skipped at once)."""
    found: list[Tensor] = []
    for item in data:
        kind = type(item)
        if kind is float or kind is int or kind is bool:
            continue
        if isinstance(item, Tensor):
            found.append(item)
        elif kind in _CONTAINERS:
            found += _tensors_in(item)
    return found


def _get_data(self: Tensor) -> Tensor:
    return _through_original(Tensor, "data", lambda p: p.__get__(self, type(self)))  # type: ignore[no-any-return,unused-ignore]


def _set_data(self: Tensor, value: Tensor) -> None:
    HOOKS.flush_for("data", self, value)
    _through_original(Tensor, "data", lambda p: p.__set__(self, value))


_REPLACEMENTS: dict[tuple[Any, str], Any] = {
    (Tensor, "__repr__"): _flushing_repr,
    (Tensor, "__dlpack__"): _flushing("dlpack", "__dlpack__"),
    (torch, "to_dlpack"): _exporting(torch, "to_dlpack"),
    (torch.utils.dlpack, "to_dlpack"): _exporting(torch.utils.dlpack, "to_dlpack"),
    (Tensor, "__cuda_array_interface__"): property(
        _flushing_array_interface, doc=_PYTORCH[Tensor, "__cuda_array_interface__"].__doc__
    ),
    (Tensor, "untyped_storage"): _flushing("storage", "untyped_storage"),
    (Tensor, "numpy"): _flushing("numpy", "numpy"),
    (Tensor, "tolist"): _flushing("tolist", "tolist"),
    (Tensor, "data"): property(_get_data, _set_data, doc=_PYTORCH[Tensor, "data"].__doc__),
    (Tensor, "new_tensor"): _from_data(Tensor, "new_tensor"),
    (torch, "tensor"): _from_data(torch, "tensor"),
    (torch, "as_tensor"): _from_data(torch, "as_tensor"),
    (torch, "asarray"): _from_data(torch, "asarray"),
    # None: taken out while the hooks are in (where there is one). Their C functions
    # export a tensor with no Python call; without them a consumer calls the watched
    # ``__dlpack__`` or ``to_dlpack``. The second is the first's name before DLPack 1.3.
    (Tensor, "__dlpack_c_exchange_api__"): None,
    (Tensor, "__c_dlpack_exchange_api__"): None,
}
