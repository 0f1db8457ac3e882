"""FrontMode: a replayed op taken above PyTorch's dispatcher, where it costs least.

A ``TorchDispatchMode`` sees an op after PyTorch's argument parsing, its dispatcher and
the Python dispatch key's own machinery: on the development machine that path costs
about as much as eager's whole CPU op, before the scheduler does anything. A
``TorchFunctionMode`` sees the call (``torch.relu(x)``, ``x + y``) before any of that.

So while a batch follows a plan (:mod:`.replay`), a call the recording saw make exactly
one op, on the same tensors, is answered here: the plan compares the call's arguments
as it would the op's, and the dispatcher never runs. Everything else (a recording, an
op the plan does not expect, autograd, autocast, a tensor subclass) goes on to the
dispatcher as if this mode were not there, where the scheduler's dispatch mode decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from gpuactors.torch.scheduler import TorchScheduler


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
