"""Messages a PersistentEngineActor understands, and its replies."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple, SupportsFloat, SupportsIndex

from pydantic import Field, model_validator

from gpuactors.engine.ops import OpSpec, Param, check_body
from gpuactors.errors import InvalidArgument
from gpuactors.messages import (
    Accepts,
    Arguments,
    Flag,
    InOrder,
    Message,
    Reply,
    Seconds,
    WholeNumber,
)

MAX_TIMEOUT_S = 1e6  # about 11.6 days: beyond that a deadline means "never"; say None
MAX_BATCH_TASKS = 1 << 31


class Enqueue(Message):
    """Run op ``op`` on ``args`` over ``n`` elements; the reply comes when the GPU is done.

    ``args`` follow the op's signature: device arrays (CuPy, anything with
    ``__cuda_array_interface__`` or DLPack) and scalars. ``blocks`` lets a large
    task span several blocks. ``timeout`` (seconds; default: the engine's
    ``default_task_timeout_s``) becomes a device-side deadline: a task not started
    by then fails with ``TaskTimeout``, and one still running ``hang_grace_ms``
    after it is declared hung (the engine faults rather than wait forever).
    ``after="current_stream"`` (default) holds the task until work already queued
    on CuPy's current stream (e.g. the kernel that filled an input) has finished;
    ``"none"`` publishes at once (the caller guarantees the inputs are ready).
    """

    op: str
    args: Accepts[Arguments, list[Any]] = Accepts(())
    n: Accepts[WholeNumber, SupportsIndex] = Field(ge=0, lt=2**62)
    blocks: Accepts[WholeNumber, SupportsIndex] = Field(default=Accepts(1), ge=1)
    timeout: Accepts[Seconds, SupportsFloat | None] = Field(
        default=Accepts(None), gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False
    )
    after: Literal["current_stream", "none"] = "current_stream"


class Completion(NamedTuple):
    """A task finished successfully on the GPU.

    A named tuple, not a pydantic model like the other replies: the engine builds one
    for every task from the integers its completion marker brought, so there is
    nothing to validate, and building it costs what a tuple costs (a validated model
    cost as much as the rest of a lone task's harvest)."""

    seq: int
    op: str
    version: int  # the op version the task ran (bound when the engine accepted it)
    status: int
    units: int
    device_ns: int


class EnqueueBatch(Message):
    """Many tasks of one op in one message, described by NumPy arrays; one reply.

    ``args`` has one entry per op parameter, as in :class:`Enqueue`: a device array
    (the *base* every task indexes into) or a scalar shared by all tasks.
    ``offsets[name]`` gives, per task, the element offset into array parameter
    ``name``'s base (missing: every task starts at element 0); offsets evenly spaced
    (a ``range``, or an array found to be one) cost nothing per task after they are
    recognised (docs/architecture.md). ``scalars[name]``
    gives one value per task for scalar parameter ``name`` (overriding ``args``).
    ``n`` is one element count for all tasks or one per task. The number of tasks
    is the length of these arrays (they must agree), or ``count`` when all are
    shared. Every task is validated against its base array's size up front.
    ``per_task=True`` returns each task's status in the reply.

    A batch of at least ``EngineConfig.expand_batches_from`` one-block tasks is a ring
    record per 65,536 tasks that the kernel expands into its tasks
    (docs/architecture.md): the host copies its columns to the device once, whatever
    its size.
    """

    op: str
    args: Accepts[Arguments, list[Any]] = Accepts(())
    n: Any = 0  # int, or a 1-D integer NumPy array (one per task)
    offsets: dict[str, Any] = Field(default_factory=dict)  # name -> 1-D int array or range
    scalars: dict[str, Any] = Field(default_factory=dict)  # name -> 1-D array
    count: Accepts[WholeNumber | None, SupportsIndex | None] = Field(
        default=Accepts(None), ge=1, le=MAX_BATCH_TASKS
    )
    blocks: Accepts[WholeNumber, SupportsIndex] = Field(default=Accepts(1), ge=1)
    # one device-side deadline for all
    timeout: Accepts[Seconds, SupportsFloat | None] = Field(
        default=Accepts(None), gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False
    )
    per_task: Flag = False
    after: Literal["current_stream", "none"] = "current_stream"


class BatchCompletion(Reply):
    """Every task of an EnqueueBatch has finished (check ``failed``)."""

    #: The ring sequence number of the batch's first record (an expanded batch has a
    #: record per 65,536 tasks, whose tasks share its number).
    first_seq: int
    count: int
    failed: int
    statuses: Any = None  # int32 array (one per task) when per_task=True


class InstallOp(Message):
    """Add an op (or a new version of one) while tasks flow.

    Compiles off the mailbox, then hands the ring to a new engine module that
    holds every installed version. ``activate`` points the op's name at this
    version once it is live (a name installed for the first time points at it either
    way: it has no other). A compile error leaves the running module serving.
    """

    op: OpSpec
    activate: Flag = True


class PrepareOp(Message):
    """Compile the engine module that installing ``op`` would need, and nothing else.

    The module lands in the kernel caches, so a later ``InstallOp`` of the same op
    (with no other install in between) swaps without compiling: the swap is then a
    park and a module load.
    """

    op: OpSpec


class OpPrepared(Reply):
    name: str
    version: int
    compile_ms: float


class ReplaceOp(Message):
    """Install the next version of op ``name`` with a new body (and optionally new
    params), and point the name at it once it is live."""

    name: str
    body: str
    params: Annotated[tuple[Param, ...], InOrder] | None = None
    multi_block: Flag | None = None

    @model_validator(mode="after")
    def _check_body(self) -> ReplaceOp:
        check_body(self.body, self.name)  # refused here, not when the engine installs it
        return self

    def applied_to(self, current: OpSpec, version: int) -> OpSpec:
        """``current`` with this body (and parameters) as ``version``; InvalidArgument
        if the result is not a valid op (an engine and a group both build it so)."""
        update: dict[str, Any] = {"body": self.body, "version": version}
        if self.params is not None:
            update["params"] = self.params
        if self.multi_block is not None:
            update["multi_block"] = self.multi_block
        try:
            return OpSpec.model_validate({**current.model_dump(), **update})
        except ValueError as exc:
            raise InvalidArgument(f"invalid replacement for {self.name!r}: {exc}") from None


class OpInstalled(Reply):
    name: str
    version: int
    active: bool
    engine_module: int  # how many engine modules this engine has built (1 = the first)
    device_generation: int
    live_at: float  # time.time() when the new module took over the ring
    compile_ms: float
    swap_pause_ms: float  # park + load: how long the kernel was not serving


class AliasOp(Message):
    """Point op ``name`` at an installed ``version``: instant (no compile, no park).

    The rule: a task runs the version its name pointed at when the engine
    accepted it. Tasks accepted before this reply run the old version (even if
    the device has not claimed them yet); tasks sent after it run the new one.
    """

    name: str
    version: Accepts[WholeNumber, SupportsIndex] = Field(ge=1)


class Rollback(Message):
    """Point op ``name`` back at the version it pointed at before the last switch."""

    name: str


class OpAliasSet(Reply):
    name: str
    version: int
    previous: int | None


class Stats(Message):
    """Ask for the engine's counters."""


class EngineStats(Reply):
    """The engine's counters. ``processed`` and ``failed`` count tasks (each task of a
    batch as one) whether or not their callers still wait: ``processed`` those that
    succeeded, ``failed`` those accepted that failed on their own account: a failure
    status (``TaskFailed``), an op the running module lacks (the device's
    ``UnknownOp``), a deadline missed on the device or while waiting for inputs or
    room (``TaskTimeout``), a hang (``TaskHung``). Neither counts a task refused when
    offered (an error at acceptance, ``QueueFull``), one dropped unpublished because
    its caller left, or one failed with the engine (``DeviceFault``, or the
    ``EngineStopped`` of a forced shutdown: ``ShutdownReport.cancelled``).
    ``in_flight`` is the single tasks in the ring, ``queue_depth`` the tasks and
    batches waiting to enter it."""

    mode: Literal["persistent", "launch-per-batch"]
    generation: int
    processed: int
    failed: int
    in_flight: int
    queue_depth: int
    launches: int
    parks: int
    park_reasons: dict[str, int]
    latency_p50_us: float | None
    latency_p99_us: float | None
    ops: tuple[str, ...]


class Drain(Message):
    """Reply once every task accepted so far has finished on the device, its caller
    waiting or not: a snapshot, so it returns under steady traffic too."""


class Drained(Reply):
    processed: int


class Shutdown(Message):
    """Stop the engine. By default drains first: nothing accepted is lost. Draining
    ends every ``Park``: the tasks a Park holds must run, and its Resume may never come
    (a later Resume ends nothing).

    ``force=True`` parks the kernel at a task boundary and fails every task that
    has not started with ``EngineStopped``; tasks already running finish. A fault found
    while it waits for that park ends the wait, and the Shutdown fails with that
    ``DeviceFault``.
    """

    force: Flag = False


class ShutdownReport(Reply):
    completed: int
    cancelled: int


class Park(Message):
    """Park the kernel now and keep it parked until its ``Resume`` (tasks wait in the
    ring). Parks count: the kernel stays parked until each has had its Resume.

    ``hold`` names this Park (unique while it holds): only ``Resume(hold=...)`` ends it
    then, and that Resume is harmless once the Park has ended, so a caller cancelled
    while it waits can always send it (``Engine.parked()`` does). A Park whose asker
    leaves (cancelled, timed out) before it answers holds nothing."""

    hold: Accepts[WholeNumber | None, SupportsIndex | None] = Accepts(None)


class Parked(Reply):
    launches: int


class Resume(Message):
    """End one ``Park``: the one named ``hold`` (nothing if it has ended already), or,
    without a name, one unnamed Park that has answered. Once none is left, the kernel
    relaunches on the next task."""

    hold: Accepts[WholeNumber | None, SupportsIndex | None] = Accepts(None)
