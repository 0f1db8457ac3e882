"""The PyTorch modes of the scheduler and of a traced function's recording.

* :class:`DispatchMode`, a ``TorchDispatchMode``, sees every aten op after PyTorch's
  argument parsing and dispatcher: the scheduler records it, follows a plan with it or
  leaves it to PyTorch (:meth:`~.TorchScheduler.dispatch`).
* :class:`FrontMode`, a ``TorchFunctionMode``, sees the call (``torch.relu(x)``,
  ``x + y``) before any of that. On the development machine the path down to the
  dispatch mode costs about as much as eager's whole CPU op, before the scheduler does
  anything. So while a batch follows a plan (:mod:`.replay`), a call the recording saw
  make exactly one op, on the same tensors, is answered here: the plan compares the
  call's arguments as it would the op's, and the dispatcher never runs. Everything else
  (a recording, an op the plan does not expect, autograd, autocast, a tensor subclass)
  goes on to the dispatcher as if this mode were not there
  (:meth:`~.TorchScheduler.front_call`).

* :class:`SizeReads` notes whether a recording read a tensor's sizes (:mod:`.trace`).

They live here, apart from the modules that use them, because they subclass PyTorch's
classes: those modules are compiled (``setup.py``), and a compiled class cannot derive
from an interpreted one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from gpuactors.torch.scheduler import TorchScheduler


class DispatchMode(TorchDispatchMode):  # type: ignore[misc,unused-ignore]
    """Hands every aten op to its scheduler's :meth:`~.TorchScheduler.dispatch`."""

    def __init__(self, scheduler: TorchScheduler) -> None:
        super().__init__()
        self.scheduler = scheduler

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.scheduler.dispatch(func, types, args, {} if kwargs is None else kwargs)


class FrontMode(TorchFunctionMode):  # type: ignore[misc,unused-ignore]
    """Hands every call to its scheduler's :meth:`~.TorchScheduler.front_call`."""

    def __init__(self, scheduler: TorchScheduler) -> None:
        super().__init__()
        self.scheduler = scheduler

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.scheduler.front_call(func, types, args, {} if kwargs is None else kwargs)


class SizeReads(TorchFunctionMode):  # type: ignore[misc,unused-ignore]
    """Notes whether the code it watches read a tensor's sizes (a traced function's
    recording: :mod:`.trace`). A function mode sees these reads, which are no ops."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _SIZE_READS:
            self.seen = True
        return func(*args, **(kwargs or {}))


#: What reads a tensor's sizes (its rank and dim order are part of the signature).
_SIZE_READS = {
    Tensor.shape.__get__,
    Tensor.nbytes.__get__,
    Tensor.size,
    Tensor.numel,
    torch.numel,
    Tensor.__len__,
    Tensor.stride,
}
