"""Traced mode: record a function's op program once, replay it on new tensors.

``f = trace(fn, scheduler)``; ``f(x, y)`` runs ``fn`` under the scheduler the first
time it sees a *shape signature* and keeps the program it built as a template. Later
calls with the same signature skip ``fn`` and every per-op step. The first call with
new exact shapes *binds* the template to them (its sizes and strides patched in once);
a call whose shapes are bound (a hot loop's) allocates the results, patches the
addresses of its tensors into a copy of the bound words (one NumPy assignment) and
runs it.

The signature is what decides the program's structure, not the sizes: per tensor
argument its dtype, device, rank and layout (:func:`.layout.order_key`: contiguous,
or its dims' order in memory and which are expanded, stride 0; what decides the layout
eager PyTorch gives its results), which dims are 1, which dims are
equal to which others (so broadcasting works out the same) and whether it is the same
tensor as an earlier argument, plus the other arguments themselves, grad mode and
autocast's state on the scheduler's device (whose casts a recording holds). New sizes
within one signature reuse the template.

A recording that read a tensor's sizes (``x.shape``, ``x.size()``, ``x.numel()``,
``len(x)``, ``x.stride()``, ``x.nbytes``) may have computed a number from them (``x * d ** -0.5``),
which its program holds: such a recording is kept for its exact shapes only, and each
new set of shapes is recorded again.

What a trace cannot see, as with ``torch.jit.trace``: Python control flow that depends
on values (the recorded branch is replayed), and tensors ``fn`` reaches
other than its arguments, which the trace keeps (their memory is read where it is at
each run, but rebinding the name has no effect; a size they fix stays fixed). A call
whose recording needed PyTorch for any op, or that returns anything but tensors, is
not traceable: its signature runs ``fn`` under the scheduler every time (correct, not
faster).
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.autograd.graph import increment_version
from torch.nn import Parameter

from gpuactors.torch import program as P
from gpuactors.torch.batch import Batch, UnitSpread
from gpuactors.torch.front import SizeReads
from gpuactors.torch.layout import order_key
from gpuactors.torch.scheduler import TorchScheduler

#: A size of the recording: an input dim ``(k, d)`` or a constant.
Size = tuple[int, int] | int
#: A word to patch per call, as a small expression: ("size", s), ("numel", sizes),
#: ("ptr", role, index), ("stride", role, index, dim), ("inv", s), ("const", v);
#: "lo"/"hi" halves of 64-bit values are chosen by the patch's ``half``.
Expr = tuple[Any, ...]


class _Tracer:
    """Told by the batch of every load, store and fresh result while ``fn`` records.
    A tensor's role: argument ``k`` ("in"), the ``j``-th result made ("new"), or a
    constant reached some other way ("const", baked in)."""

    def __init__(self, inputs: Sequence[Tensor]) -> None:
        self.inputs = {id(t): k for k, t in enumerate(inputs)}
        self.fresh_ids: dict[int, int] = {}
        self.fresh_meta: list[tuple[tuple[int, ...], torch.dtype, bool]] = []
        self.constants: list[Tensor] = []
        self.notes: list[tuple[P.PointwiseStage, int, tuple[str, int]]] = []
        self.reductions: list[tuple[P.ReduceStage, tuple[str, int], tuple[str, int], Tensor]] = []

    def fresh(self, t: Tensor) -> None:
        self.fresh_ids[id(t)] = len(self.fresh_meta)
        self.fresh_meta.append((tuple(t.shape), t.dtype, t.is_contiguous()))

    def role(self, t: Tensor) -> tuple[str, int]:
        k = self.inputs.get(id(t))
        if k is not None:
            return ("in", k)
        j = self.fresh_ids.get(id(t))
        if j is not None:
            return ("new", j)
        self.constants.append(t)
        return ("const", len(self.constants) - 1)

    def note(self, stage: P.PointwiseStage, position: int, t: Tensor) -> None:
        self.notes.append((stage, position, self.role(t)))

    def reduction(self, stage: P.ReduceStage, x: Tensor, out: Tensor) -> None:
        self.reductions.append((stage, self.role(x), self.role(out), x))


def call_modes(device_type: str) -> tuple[bool, Any]:
    """What a call's ops depend on besides its arguments, as part of its keys: grad mode
    (a constant may need autograd), and autocast's dtype on the scheduler's device (None
    where it is off). Autocast casts the inputs of some ops (CUDA's float32 list: exp,
    softplus, pow...) above the dispatcher, so a recording holds the casts or not, and
    its results' dtypes are those of the autocast state it was recorded in."""
    grad = bool(torch.is_grad_enabled())
    if torch.is_autocast_enabled(device_type):
        return grad, torch.get_autocast_dtype(device_type)
    return grad, None


def signature(args: tuple[Any, ...], modes: tuple[bool, Any]) -> tuple[Any, ...] | None:
    """The shape signature of a call (None if an argument cannot be part of a key, or is
    a tensor a program cannot stand in for: :func:`_plain`), in ``modes``
    (:func:`call_modes`)."""
    key: list[Any] = [modes]
    grad_on = modes[0]
    sizes: dict[int, int] = {}
    first: dict[int, int] = {}  # a tensor -> the first argument it is (f(x, x) is not f(a, b))
    for k, arg in enumerate(args):
        if isinstance(arg, Tensor):
            if not _plain(arg):
                return None
            classes = tuple(
                -1 if size == 1 else sizes.setdefault(size, len(sizes)) for size in arg.shape
            )
            grad = arg.requires_grad and grad_on
            same = first.setdefault(id(arg), k)
            key.append((arg.dtype, arg.device, classes, order_key(arg), grad, same))
        else:
            try:
                hash(arg)
            except TypeError:
                return None
            key.append(_value_key(arg))
    return tuple(key)


@dataclass
class _Sizes:
    """What a call's patched values are computed from, but for the addresses."""

    inputs: list[Tensor]
    sizes: dict[tuple[int, int], int]
    constants: list[Tensor]

    def size(self, s: Size) -> int:
        return s if isinstance(s, int) else self.sizes[s]

    def value(self, expr: Expr) -> int:
        kind = expr[0]
        if kind == "size":
            return self.size(expr[1])
        if kind == "numel":
            return math.prod(self.size(s) for s in expr[1])
        if kind == "stride":
            return int(self._tensor(expr[1], expr[2]).stride(expr[3]))
        if kind == "inv":
            return P.f32_bits(1.0 / self.size(expr[1]))
        if kind == "const":
            return int(expr[1])
        raise ValueError(f"{expr!r} is patched per call")  # an address

    def _tensor(self, role: str, index: int) -> Tensor:
        return self.inputs[index] if role == "in" else self.constants[index]


@dataclass
class _Plan:
    """A recorded program and how to aim it at new tensors."""

    arg_positions: list[int]  # which arguments are the tensors, in order
    words: np.ndarray
    exprs: list[Expr]  # the values a call computes, each once ...
    positions: np.ndarray  # ... the words patched per call ...
    patches: list[tuple[int, int]]  # ... with which value (an index into exprs) and shift
    fresh: list[tuple[tuple[Size, ...], torch.dtype]]  # every result of the recording
    fresh_shapes: list[tuple[Size, ...]]  # their distinct shapes (a chain's share one)
    allocate: list[int]  # the results a call allocates (the others are never stored)
    returns: tuple[str, list[tuple[str, int]]]
    first_space: tuple[Size, ...]
    first_is_reduction: bool
    guards: list[tuple[int, int, int]]  # input dims a constant fixes: (k, d, size)
    #: The tensors the program stores into (in-place updates, out=): ("in", k) or
    #: ("const", c).
    written: list[tuple[str, int]]
    #: Each constant's dtype, device, shape and strides at the recording: a call after
    #: one changed (``module.half()``, ``p.data = ...``) records again.
    constant_layouts: list[tuple[Any, ...]]
    constants: list[Tensor]


@dataclass
class _Bound:
    """A plan bound to one call's exact shapes and strides: every patched word but the
    addresses of its tensors is written once, so a later call with the same shapes (a
    hot loop's) allocates its results and writes the addresses, no more."""

    plan: _Plan
    words: np.ndarray
    address_words: np.ndarray  # the words of the addresses patched per call: low ...
    low_slots: list[int]  # ... halves, then high halves, of which address
    high_slots: list[int]
    # A call's tensors are its inputs, the results it returns (new for each call), its
    # scratch, then the constants (an address is read per call: a constant's memory may
    # move, as ``p.data = ...`` or ``module.to()`` do); indices below are into that list.
    addresses: list[int]  # the tensors whose addresses are patched
    allocations: list[tuple[tuple[int, ...], torch.dtype]]  # (shape, dtype) per result
    #: The results that only the program reads (a reduction's input, which the stage
    #: before it wrote): a stream runs its calls one after another, so they share them.
    scratch_shapes: list[tuple[tuple[int, ...], torch.dtype]]
    numel: int
    units: int
    returns: list[int]
    written: list[int]  # the tensors the program stores into (see _Plan.written)
    serial: int  # which binding of its traced function (its scratch's key)


class TracedFunction:
    """``fn`` recorded per shape signature and replayed (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], scheduler: TorchScheduler) -> None:
        self.fn = fn
        self.scheduler = scheduler
        self._device_type: str = scheduler.device.type  # (whose autocast state counts)
        try:  # (to call with keyword arguments; a module's are its forward's)
            forward = fn.forward if isinstance(fn, torch.nn.Module) else fn
            self._parameters: inspect.Signature | None = inspect.signature(forward)
        except (TypeError, ValueError):
            self._parameters = None
        #: By signature, or (signature, exact shapes) for those in ``_per_shape``; None:
        #: not traceable.
        self._plans: dict[tuple[Any, ...], _Plan | None] = {}
        #: Signatures whose recording read sizes: recorded per set of exact shapes.
        self._per_shape: set[tuple[Any, ...]] = set()
        self._bound: dict[tuple[Any, ...], _Bound] = {}  # by exact_shapes
        #: Scratch by (binding, stream handle or None off CUDA), the oldest first.
        self._scratch_kept: dict[tuple[int, int | None], list[Tensor]] = {}
        self._lock = threading.Lock()  # (for what calls add: bindings, scratch)
        self.recordings = 0
        self.bindings = 0  # plans bound to a new set of exact shapes
        self.replays = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            positional = self._positional(args, kwargs)
            if positional is None:  # keyword-only parameters (or a call fn refuses)
                with self.scheduler:
                    return self.fn(*args, **kwargs)
            args = positional
        modes = call_modes(self._device_type)
        exact = exact_shapes(args, modes)
        bound = None if exact is None else self._bound.get(exact)
        if bound is not None and bound.plan.constants and _constants_changed(bound.plan):
            self._forget()
            bound = None
        if bound is None:
            key = signature(args, modes)
            per_shape = key is not None and key in self._per_shape
            if per_shape:
                key = (key, exact)
            plan = None if key is None else self._plans.get(key)
            if plan is not None and plan.constants and _constants_changed(plan):
                self._forget()
            if key is not None and key not in self._plans:
                return self._record(key, args, per_shape, exact)
            bound = None if plan is None else self._bound_to(plan, exact, args)
        if bound is not None and not _writes_refused(bound.plan, args):
            return self._run(bound, args)
        with self.scheduler:
            return self.fn(*args)

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """The call's arguments as ``fn``'s positional ones, or None where it takes some
        by keyword only (or they do not fit it: ``fn`` then raises as it would)."""
        if self._parameters is None:
            return None
        try:
            call = self._parameters.bind(*args, **kwargs)
        except TypeError:
            return None
        return None if call.kwargs else call.args

    def _forget(self) -> None:
        """Drop every plan: a constant's layout changed, so each is recorded again."""
        with self._lock:
            self._plans.clear()
            self._per_shape.clear()
            self._bound.clear()
            self._scratch_kept.clear()

    def _bound_to(
        self, plan: _Plan, exact: tuple[Any, ...] | None, args: tuple[Any, ...]
    ) -> _Bound | None:
        """``plan`` bound to the shapes of ``args`` (kept by ``exact``), or None if
        they do not fit it."""
        inputs = [args[k] for k in plan.arg_positions]
        sizes = _sizes(inputs)
        if not _fits(plan, inputs, sizes, self.scheduler.size_threshold):
            return None
        bound = self._bind(plan, inputs, sizes)
        if exact is not None:
            with self._lock:
                _keep(self._bound, exact, bound, MAX_BOUND)
        return bound

    def _record(
        self,
        key: tuple[Any, ...],
        args: tuple[Any, ...],
        per_shape: bool,
        exact: tuple[Any, ...] | None,
    ) -> Any:
        """Run ``fn`` under the scheduler, keeping its program under ``key`` (a signature,
        or with ``per_shape`` a signature and exact shapes) if it can be replayed;
        ``exact``: the call's exact shapes (taken before ``fn`` ran)."""
        inputs = [a for a in args if isinstance(a, Tensor)]
        positions = [k for k, a in enumerate(args) if isinstance(a, Tensor)]
        tracer = _Tracer(inputs)
        self.recordings += 1
        with self.scheduler.recording(tracer) as whole:
            with SizeReads() as reads:
                result = self.fn(*args)
            batch = whole()
            plan = None
            if batch is not None:
                spread = self.scheduler.executor.spread
                plan = _build(batch, tracer, result, inputs, positions, spread)
        with self._lock:
            if plan is not None and reads.seen and not per_shape:
                self._per_shape.add(key)
                key = (key, exact)
            _keep(self._plans, key, plan, MAX_PLANS)
        return result

    def _bind(self, plan: _Plan, inputs: list[Tensor], sizes: dict[tuple[int, int], int]) -> _Bound:
        """``plan`` with every value of these shapes patched in, the addresses of its
        tensors left for each call."""
        with self._lock:
            self.bindings += 1
            serial = self.bindings
        call = _Sizes(inputs, sizes, plan.constants)
        words = plan.words.copy()
        # A call's tensors: its inputs, the results it returns, its scratch, the constants.
        returned = {index for role, index in plan.returns[1] if role == "new"}
        results = [j for j in plan.allocate if j in returned]
        scratch = [j for j in plan.allocate if j not in returned]
        tensor = {("in", k): k for k in range(len(inputs))}
        tensor.update((("new", j), len(inputs) + i) for i, j in enumerate(results + scratch))
        at = len(inputs) + len(results) + len(scratch)
        tensor.update((("const", c), at + c) for c in range(len(plan.constants)))
        addresses: dict[int, int] = {}  # tensor -> its slot
        low: list[tuple[int, int]] = []  # (word, slot)
        high: list[tuple[int, int]] = []
        for position, (k, shift) in zip(plan.positions.tolist(), plan.patches, strict=True):
            expr = plan.exprs[k]
            if expr[0] == "ptr":
                slot = addresses.setdefault(tensor[expr[1], expr[2]], len(addresses))
                (high if shift else low).append((position, slot))
            else:
                words[position] = (call.value(expr) >> shift) & 0xFFFFFFFF
        numel = math.prod(call.size(s) for s in plan.first_space)
        spread = self.scheduler.executor.spread
        if plan.first_is_reduction:
            units = spread.reduction(numel // call.size(plan.first_space[-1]))
        else:
            units = spread.pointwise(numel)
        return _Bound(
            plan=plan,
            words=words,
            address_words=np.array([p for p, _ in low + high], dtype=np.int64),
            low_slots=[slot for _, slot in low],
            high_slots=[slot for _, slot in high],
            addresses=list(addresses),
            allocations=[
                (tuple(call.size(s) for s in plan.fresh[j][0]), plan.fresh[j][1]) for j in results
            ],
            scratch_shapes=[
                (tuple(call.size(s) for s in plan.fresh[j][0]), plan.fresh[j][1]) for j in scratch
            ],
            numel=numel,
            units=units,
            returns=[tensor[role] for role in plan.returns[1]],
            written=[tensor[role] for role in plan.written],
            serial=serial,
        )

    def _run(self, bound: _Bound, args: tuple[Any, ...]) -> Any:
        """One call of a bound plan: its results allocated, the addresses patched."""
        stream = self.scheduler.current_stream()
        tensors = [args[k] for k in bound.plan.arg_positions]
        device = self.scheduler.device
        for shape, dtype in bound.allocations:
            tensors.append(torch.empty(shape, dtype=dtype, device=device))
        if bound.scratch_shapes:
            tensors += self._scratch(bound, stream)
        tensors += bound.plan.constants
        at = [tensors[i].data_ptr() for i in bound.addresses]
        words = bound.words.copy()
        words[bound.address_words] = [at[k] & 0xFFFFFFFF for k in bound.low_slots] + [
            at[k] >> 32 for k in bound.high_slots
        ]
        self.replays += 1
        self.scheduler.run_program(words, bound.numel, bound.units, "replay", stream)
        for i in bound.written:
            # What an in-place op's dispatch does: autograd then refuses a saved copy of
            # the tensor, as in eager code. (An inference tensor is written only in
            # inference mode, where this leaves it be: it has no version.)
            increment_version(tensors[i])
        out = [tensors[i] for i in bound.returns]
        kind = bound.plan.returns[0]
        if kind == "tensor":
            return out[0]
        return tuple(out) if kind == "tuple" else out

    def _scratch(self, bound: _Bound, stream: Any) -> list[Tensor]:
        """``bound``'s scratch for a call on ``stream``: the stream's own, kept from its
        last call, except while a CUDA graph captures the call (the graph may replay
        beside other calls: it gets scratch of its own from the graph's memory pool)."""
        capturing = stream is not None and torch.cuda.is_current_stream_capturing()
        key = (bound.serial, None if stream is None else int(stream.cuda_stream))
        kept = None if capturing else self._scratch_kept.get(key)
        if kept is None:
            device = self.scheduler.device
            kept = [
                torch.empty(shape, dtype=dtype, device=device)
                for shape, dtype in bound.scratch_shapes
            ]
            if not capturing:
                # An older one dropped: memory a launch still uses returns to PyTorch's
                # allocator for that launch's stream only, after it.
                with self._lock:
                    _keep(self._scratch_kept, key, kept, MAX_SCRATCH)
        return kept


def _keep(kept: dict[Any, Any], key: Any, value: Any, most: int) -> None:
    """``kept[key] = value``, dropping the oldest entries beyond ``most`` (lock held)."""
    kept[key] = value
    while len(kept) > most:
        kept.pop(next(iter(kept)))


#: Bound plans a traced function keeps, one per exact set of shapes it was called with
#: (the one bound first goes first).
MAX_BOUND = 64
#: Recordings a traced function keeps (the oldest goes first).
MAX_PLANS = 64
#: Scratch sets a traced function keeps, one per binding and stream (the oldest goes
#: first): at most this many times the largest binding's scratch.
MAX_SCRATCH = 16


_STRIDED = torch.strided


def _plain(t: Tensor) -> bool:
    """Whether a program can stand in for ``fn`` on ``t``: a ``Tensor`` (or a
    ``Parameter``, whose ops are Tensor's) whose memory holds its values as its sizes and
    strides say. A subclass has its own dispatch, and a sparse, nested or lazily negated
    tensor is read otherwise; docs/torch.md leaves them to PyTorch. (A lazily conjugated
    tensor is complex, a dtype no program reads.) Asked per tensor of every call: the
    checks of :func:`.batch.strided`, inline."""
    kind = type(t)
    return (
        (kind is Tensor or kind is Parameter)
        and t.layout is _STRIDED
        and not t.is_nested
        and not t.is_neg()
    )


def _value_key(arg: Any) -> tuple[Any, ...]:
    """A non-tensor argument as part of a key: a float (Python's or NumPy's) by its
    bits, as 0.0 and -0.0 (and two NaNs) compare otherwise than they compute."""
    if isinstance(arg, float):  # np.float64 too, a subclass
        return ("value", type(arg), float(arg).hex())
    if isinstance(arg, np.floating):  # np.float32, np.float16, np.longdouble
        return ("value", type(arg), arg.tobytes())
    return ("value", type(arg), arg)


def _layout(t: Tensor) -> tuple[Any, ...]:
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


def _constants_changed(plan: _Plan) -> bool:
    return any(
        _layout(c) != layout
        for c, layout in zip(plan.constants, plan.constant_layouts, strict=True)
    )


def exact_shapes(args: tuple[Any, ...], modes: tuple[bool, Any]) -> tuple[Any, ...] | None:
    """What a bound plan is kept by: the signature's inputs, exactly (every size and
    stride), in ``modes`` (:func:`call_modes`), or None if an argument cannot be part of
    a key (as for :func:`signature`)."""
    key: list[Any] = [modes]
    first: dict[int, int] = {}  # a tensor -> the first argument it is
    for k, arg in enumerate(args):
        if isinstance(arg, Tensor):
            if not _plain(arg):
                return None
            same = first.setdefault(id(arg), k)
            key.append((arg.shape, arg.stride(), arg.dtype, arg.device, arg.requires_grad, same))
        else:
            key.append(_value_key(arg))
    exact = tuple(key)
    try:
        hash(exact)
    except TypeError:
        return None
    return exact


def trace(fn: Callable[..., Any], scheduler: TorchScheduler) -> TracedFunction:
    """``fn`` traced on ``scheduler`` (see :class:`TracedFunction`)."""
    return TracedFunction(fn, scheduler)


def _patches(
    patches: Sequence[tuple[int, Expr, int]],
) -> tuple[list[Expr], np.ndarray, list[tuple[int, int]]]:
    """A plan's patches, (word position, value, which 32-bit half), as its distinct
    values (a call computes each once), the words patched, and per word which value
    and shift it takes."""
    exprs = list(dict.fromkeys(expr for _, expr, _ in patches))
    index = {expr: k for k, expr in enumerate(exprs)}
    positions = np.array([p for p, _, _ in patches], dtype=np.int64)
    return exprs, positions, [(index[expr], 32 * half) for _, expr, half in patches]


def _sizes(inputs: Sequence[Tensor]) -> dict[tuple[int, int], int]:
    return {(k, d): size for k, t in enumerate(inputs) for d, size in enumerate(t.shape)}


def _fits(plan: _Plan, inputs: list[Tensor], sizes: dict[tuple[int, int], int], limit: int) -> bool:
    """Whether this call can replay: sizes that constants fix are unchanged, and no
    tensor is larger than the scheduler takes (or empty)."""
    if not all(sizes[k, d] == size for k, d, size in plan.guards):
        return False
    if not all(0 < t.numel() <= limit for t in inputs):
        return False
    return all(
        math.prod(s if isinstance(s, int) else sizes[s] for s in shape) <= limit
        for shape in plan.fresh_shapes
    )


def _writes_refused(plan: _Plan, args: tuple[Any, ...]) -> bool:
    """Whether a store of the program is one eager PyTorch would order otherwise or
    refuse: ``fn`` then runs under the scheduler, as eager code would (and raises where
    it does)."""
    if not plan.written:
        return False
    return _writes_overlapping_memory(plan, args) or _writes_inference_tensor(plan, args)


def _writes_inference_tensor(plan: _Plan, args: tuple[Any, ...]) -> bool:
    """Whether the program stores into an inference tensor outside inference mode, an
    in-place update eager PyTorch refuses."""
    if torch.is_inference_mode_enabled():
        return False
    inputs = [args[k] for k in plan.arg_positions]
    return any(
        (inputs[index] if role == "in" else plan.constants[index]).is_inference()
        for role, index in plan.written
    )


def _writes_overlapping_memory(plan: _Plan, args: tuple[Any, ...]) -> bool:
    """Whether a tensor the program stores into shares memory with another tensor of
    the call that the recording took apart from it (an argument that views it, a
    constant, or the constant itself passed as an argument), or with itself (an
    expanded view, which eager PyTorch refuses to write): a value loaded once may be
    used after the store that eager PyTorch would let it see. One object in two roles
    of the same kind was one at the recording too (the signature says so)."""
    if not plan.written:
        return False
    inputs = [args[k] for k in plan.arg_positions]
    for role, index in plan.written:
        target = inputs[index] if role == "in" else plan.constants[index]
        if P.has_internal_overlap(target.shape, target.stride()):
            return True
        same_kind, other_kind = (
            (inputs, plan.constants) if role == "in" else (plan.constants, inputs)
        )
        others = [t for t in same_kind if t is not target] + list(other_kind)
        start, end = _extent(target)
        for other in others:
            other_start, other_end = _extent(other)
            if other_start < end and start < other_end:
                return True
    return False


def _extent(t: Tensor) -> tuple[int, int]:
    """The bytes ``t`` spans: from its first element to its last (strides are >= 0)."""
    start = int(t.data_ptr())
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * t.element_size()


def _returns(result: Any, tracer: _Tracer) -> tuple[str, list[tuple[str, int]]] | None:
    if isinstance(result, Tensor):
        kind, items = "tensor", [result]
    elif isinstance(result, (tuple, list)) and all(isinstance(r, Tensor) for r in result):
        kind, items = ("tuple" if isinstance(result, tuple) else "list"), list(result)
    else:
        return None
    roles = [tracer.role(item) for item in items]
    if any(role == "const" for role, _ in roles):
        return None
    return kind, roles


def _build(
    batch: Batch,
    tracer: _Tracer,
    result: Any,
    inputs: Sequence[Tensor],
    positions: list[int],
    spread: UnitSpread,
) -> _Plan | None:
    """The plan of a recorded batch, or None if it cannot be replayed."""
    returns = _returns(result, tracer)
    if returns is None or not all(contiguous for _, _, contiguous in tracer.fresh_meta):
        return None
    # Every size of the recording as the first input dim that equals it (the signature
    # keeps those equalities); 1 and sizes only constants have stay as they are.
    symbols: dict[int, tuple[int, int]] = {}
    for k, t in enumerate(inputs):
        for d, size in enumerate(t.shape):
            if size != 1:
                symbols.setdefault(size, (k, d))

    def sym(size: int) -> Size:
        return symbols.get(size, size) if size != 1 else 1

    constant_sizes = {size for t in tracer.constants for size in t.shape}
    guards = [
        (k, d, size)
        for k, t in enumerate(inputs)
        for d, size in enumerate(t.shape)
        if size != 1 and size in constant_sizes
    ]
    fresh = [(tuple(sym(s) for s in shape), dtype) for shape, dtype, _ in tracer.fresh_meta]
    words = np.asarray(batch.assemble(spread)[0], dtype=np.uint32)
    patches: list[tuple[int, Expr, int]] = []

    def put(position: int, expr: Expr, wide: bool = False) -> None:
        patches.append((position, expr, 0))
        if wide:
            patches.append((position + 1, expr, 1))

    def own_strides(role: tuple[str, int], rank: int) -> list[Expr]:
        kind, index = role
        if kind == "new":  # contiguous: the product of the sizes after each dim
            shape = fresh[index][0]
            return [("numel", shape[d + 1 :]) for d in range(rank)]
        return [("stride", kind, index, d) for d in range(rank)]

    def shape_of(role: tuple[str, int]) -> tuple[Size, ...]:
        kind, index = role
        if kind == "new":
            return fresh[index][0]
        source = inputs[index] if kind == "in" else tracer.constants[index]
        return tuple(sym(s) if kind == "in" else s for s in source.shape)

    offsets: dict[int, int] = {}
    at = P.HEADER_WORDS
    for stage in batch.stages:
        offsets[id(stage)] = at
        if isinstance(stage, P.PointwiseStage):
            space = tuple(sym(s) for s in stage.space)
            put(at + 2, ("numel", space), wide=True)
            for d, s in enumerate(space):
                put(at + 4 + d, ("size", s))
        at += len(stage.words())
    allocate: set[int] = {index for role, index in returns[1] if role == "new"}
    written: set[tuple[str, int]] = set()
    for stage, position, role in tracer.notes:
        space = tuple(sym(s) for s in stage.space)
        at = offsets[id(stage)] + 4 + len(space) + position
        head = int(words[at])
        if head & 0xFF == P.OP_SKIP:
            continue  # the store of a result nobody reads
        if role[0] == "new":
            allocate.add(role[1])
        if role[0] != "new" and head & 0xFF == P.OP_STORE:
            written.add(role)
        put(at + 1, ("ptr", *role), wide=True)
        if (head >> 24) & 0xF == P.MODE_STRIDED and role[0] != "const":
            shape = shape_of(role)
            offset = len(space) - len(shape)
            strides = own_strides(role, len(shape))
            for d, s in enumerate(shape):
                if s != 1:  # broadcast dims keep their recorded 0
                    put(at + 3 + 2 * (offset + d), strides[d], wide=True)
    for reduce_stage, x_role, out_role, x in tracer.reductions:
        base = offsets[id(reduce_stage)]
        if reduce_stage.rows == 0:
            continue  # its result died unread: it stays a reduction of no row
        allocate.update(index for role, index in (x_role, out_role) if role == "new")
        if out_role[0] != "new":
            written.add(out_role)
        shape = shape_of(x_role) if x_role[0] != "const" else tuple(x.shape)
        put(base + 2, ("numel", shape[:-1]), wide=True)
        put(base + 4, ("size", shape[-1]))
        put(base + 5, ("ptr", *out_role), wide=True)
        put(base + 8, ("ptr", *x_role), wide=True)
        put(base + 10, ("inv", shape[-1]))
        for d, s in enumerate(shape):
            put(base + 11 + d, ("size", s))
        if x_role[0] != "const":
            for d, stride in enumerate(own_strides(x_role, len(shape))):
                put(base + 11 + len(shape) + 2 * d, stride, wide=True)

    first = batch.stages[0]
    if isinstance(first, P.ReduceStage):
        x_first = next(x for st, _, _, x in tracer.reductions if st is first)
        first_space = tuple(sym(s) for s in x_first.shape)
    else:
        first_space = tuple(sym(s) for s in first.space)
    exprs, patched, word_patches = _patches(patches)
    compact, moved = P.without_skips(words.tolist())
    patched = np.asarray(moved, dtype=np.int64)[patched]
    if not bool((patched >= 0).all()):  # the stores of dead results are never patched
        raise RuntimeError("a traced plan patches a word of a store it dropped")
    return _Plan(
        arg_positions=positions,
        words=np.asarray(compact, dtype=np.uint32),
        exprs=exprs,
        positions=patched,
        patches=word_patches,
        fresh=fresh,
        fresh_shapes=list(dict.fromkeys(shape for shape, _ in fresh)),
        allocate=sorted(allocate),
        returns=returns,
        first_space=first_space,
        first_is_reduction=isinstance(first, P.ReduceStage),
        guards=guards,
        written=sorted(written),
        constant_layouts=[_layout(c) for c in tracer.constants],
        constants=list(tracer.constants),
    )
