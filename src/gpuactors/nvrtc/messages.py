"""Messages an :class:`~gpuactors.nvrtc.actor.NvrtcActor` understands, and its replies.

Fields are checked when a message is built: a bad field raises
:class:`~gpuactors.errors.InvalidArgument` at the call site, before anything is
queued. What needs the actor's state (a stale handle, the device, the kernel's
signature) is checked by the actor and comes back as the ask's error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, SupportsIndex

from pydantic import Field, field_validator, model_validator

from gpuactors.errors import InvalidArgument
from gpuactors.messages import Accepts, Arguments, Flag, InOrder, Message, Reply, WholeNumber
from gpuactors.numeric import whole_number
from gpuactors.nvrtc.handle import KernelHandle
from gpuactors.nvrtc.linker import LinkInput, LinkOpts
from gpuactors.nvrtc.options import NvrtcOpts
from gpuactors.nvrtc.text import check_headers, check_name, check_no_nul, check_size

if TYPE_CHECKING:  # typing.Self is Python 3.11+; only an annotation needs it here
    from typing import Self

#: A launch shape, always three positive ints after validation.
Dims = tuple[int, int, int]
#: A launch shape as a caller gives it: a whole number, or 1 to 3 of them in a tuple or a
#: list (missing dimensions are 1).
Shape = SupportsIndex | Sequence[SupportsIndex]
#: Kernel names as a caller gives them: one name, or a tuple or list of names.
KernelNames = str | Sequence[str]

_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)
_MAX_BLOCK_THREADS = 1024


class _Checked(Message):
    """A message whose validation errors are :class:`InvalidArgument` (a ValueError);
    every :class:`Message` does this now, the name stays for readability."""


# ------------------------------------------------------------------- compiling
class CompileRequest(_Checked):
    """What both compile messages carry (send :class:`Compile` or :class:`CompileAsync`).

    ``kernel_names`` are the kernels the handle will launch: an ``extern "C"`` kernel
    by its name, a template or C++ kernel by a name expression that is also listed
    in ``opts.name_expressions`` (e.g. ``"scale<float>"``). ``opts.arch=None``
    compiles for the actor's device (required where there is no GPU). ``headers``
    maps include names to their text.

    No text may hold a NUL (NVRTC would stop reading there) and no name a control
    character: :class:`InvalidArgument` names the field. The source and headers hold
    at most :data:`~gpuactors.nvrtc.text.MAX_SOURCE_CHARS` characters together.
    """

    source: str
    kernel_names: Accepts[tuple[str, ...], KernelNames]
    opts: NvrtcOpts = Field(default_factory=NvrtcOpts)
    name: str = "kernel.cu"
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        return check_no_nul(value, "source")

    @field_validator("name")
    @classmethod
    def _check_program_name(cls, value: str) -> str:
        return check_name(value, "program name")

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        check_headers(value)
        return value

    @model_validator(mode="after")
    def _check_size(self) -> Self:
        check_size(self.source, self.headers)
        return self

    @field_validator("kernel_names", mode="before")
    @classmethod
    def _one_name(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("kernel_names")
    @classmethod
    def _check_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_kernel_names(value)


def check_kernel_names(value: tuple[str, ...]) -> tuple[str, ...]:
    """``value`` if it names one or more distinct, non-empty kernels, else InvalidArgument."""
    if not value:
        raise InvalidArgument("kernel_names must name at least one kernel")
    for name in value:
        if not name.strip():
            raise InvalidArgument("a kernel name cannot be empty")
        check_name(name, "kernel name")
    if len(set(value)) != len(value):
        raise InvalidArgument(f"duplicate kernel names in {value!r}")
    return value


class Compile(CompileRequest):
    """Compile on the actor's mailbox; the reply is a :class:`KernelHandle`.

    The compile runs inside the handler: the actor and its event loop wait for
    NVRTC (a cache hit is microseconds). Services should send :class:`CompileAsync`.
    """


class CompileAsync(CompileRequest):
    """Compile in a worker thread; the reply is a :class:`KernelHandle`.

    The actor keeps serving other messages (launches of kernels it already has)
    while NVRTC runs. Concurrent identical requests share one compile.
    """


# --------------------------------------------------------------------- linking
class LinkRequest(_Checked):
    """What both link messages carry (send :class:`Link` or :class:`LinkAsync`).

    ``inputs`` are handles of compiles with ``relocatable=True`` and raw
    :class:`~gpuactors.nvrtc.linker.LinkInput` images (PTX, CUBIN, LTO-IR, fatbin,
    object, library; ``LinkInput.of(module)`` for a :class:`CompiledModule`), linked in
    order into one CUBIN. ``kernel_names`` are the kernels the reply's handle launches.
    ``opts.arch=None`` links for the actor's device (required where there is no GPU).
    """

    inputs: Annotated[tuple[LinkInput | KernelHandle, ...], InOrder]
    kernel_names: Accepts[tuple[str, ...], KernelNames]
    opts: LinkOpts = Field(default_factory=LinkOpts)
    name: str = "linked"

    @field_validator("inputs")
    @classmethod
    def _check_inputs(
        cls, value: tuple[LinkInput | KernelHandle, ...]
    ) -> tuple[LinkInput | KernelHandle, ...]:
        if not value:
            raise InvalidArgument("a link needs at least one input")
        return value

    @field_validator("name")
    @classmethod
    def _check_link_name(cls, value: str) -> str:
        return check_name(value, "link name")

    @field_validator("kernel_names", mode="before")
    @classmethod
    def _one_name(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("kernel_names")
    @classmethod
    def _check_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_kernel_names(value)

    def link_inputs(self) -> tuple[LinkInput, ...]:
        """The inputs as images: a handle's module, named by its program name."""
        return tuple(
            LinkInput.of(piece.module) if isinstance(piece, KernelHandle) else piece
            for piece in self.inputs
        )


class Link(LinkRequest):
    """Link on the actor's mailbox; the reply is a :class:`KernelHandle` whose ``log``
    is the linker's info log and ``compile_seconds`` the link's wall time. A cache hit
    is microseconds; a link is milliseconds (LTO: more): services send :class:`LinkAsync`.
    """


class LinkAsync(LinkRequest):
    """Link in a worker thread; the reply is a :class:`KernelHandle`. The actor keeps
    serving meanwhile; concurrent identical requests share one link."""


# ------------------------------------------------------------------- releasing
class ReleaseKernel(_Checked):
    """Give back a handle this actor replied (``Compile``, ``CompileAsync``, ``Link``,
    ``LinkAsync``); the reply is a :class:`KernelReleased`.

    The handle is dead on this actor from then on: a ``Launch`` of it, or a second
    release, raises :class:`~gpuactors.errors.GpuRefStale` (launches already queued on
    the GPU finish). Compiles of the same request share one module, and every handle
    replied holds it once, like a reference count: the module is unloaded when the
    last handle holding it is released (its image stays in the compiler's memory
    cache, which the process shares: a later compile loads it again without NVRTC).
    A handle dropped without a release keeps its hold. A handle this actor did not
    reply holds nothing here: releasing it ends it here and unloads the module if no
    handle of this actor holds it.
    """

    kernel: KernelHandle


class KernelReleased(Reply):
    """A handle was released."""

    #: Handles of this actor that still hold the module.
    holds_left: int
    #: No handle holds the module any more: the actor dropped it (unloaded once the
    #: launches still running from it end) and the memory caches forgot it.
    unloaded: bool


class CompilerStats(Message):
    """Ask for the actor's counters (cheap: answered at once, even mid-compile)."""


class NvrtcStats(Reply):
    device_id: int
    #: The device's own architecture; None where this process has no GPU.
    arch: str | None
    #: NVRTC compiles the actor's compiler has run (failed ones included).
    compiles: int
    compile_requests: int
    compiles_in_flight: int
    loaded_modules: int
    launches: int
    launches_in_flight: int
    #: The device fault that stops launches until the generation changes, if any.
    fault: str | None


# -------------------------------------------------------------------- launching
def _dims(value: object, what: str, limits: tuple[int, int, int]) -> Dims:
    # Plain ints first, the way launches are usually written: one int, or a tuple of them.
    if type(value) is int and 1 <= value <= limits[0]:
        return value, 1, 1
    if isinstance(value, tuple | list):
        items: Sequence[object] = value
    elif whole_number(value) is not None:  # a NumPy integer, a 0-d array (gpuactors.numeric)
        items = (value,)
    else:
        raise InvalidArgument(f"{what} must be an int or a tuple of 1 to 3 ints, not {value!r}")
    if not 1 <= len(items) <= 3:
        raise InvalidArgument(f"{what} must have 1 to 3 dimensions, got {len(items)}: {value!r}")
    dims = [1, 1, 1]
    for axis, item in enumerate(items):
        number = item if type(item) is int else whole_number(item)
        if number is None:
            raise InvalidArgument(f"{what}[{axis}] must be an int, not {item!r}")
        if not 1 <= number <= limits[axis]:
            raise InvalidArgument(f"{what}[{axis}] must be in 1..{limits[axis]}, got {number}")
        dims[axis] = number
    return dims[0], dims[1], dims[2]


def grid_dims(value: object) -> Dims:
    """``value`` as a 3-D grid, or InvalidArgument."""
    return _dims(value, "grid", _MAX_GRID)


def block_dims(value: object) -> Dims:
    """``value`` as a 3-D block of at most 1024 threads, or InvalidArgument."""
    dims = _dims(value, "block", _MAX_BLOCK)
    threads = dims[0] * dims[1] * dims[2]
    if threads > _MAX_BLOCK_THREADS:
        raise InvalidArgument(
            f"block {dims} has {threads} threads; a block holds at most {_MAX_BLOCK_THREADS}"
        )
    return dims


class LaunchShape(_Checked):
    """A launch's ``grid`` and ``block``: an int or 1 to 3 ints each (missing
    dimensions are 1), checked against CUDA's limits."""

    grid: Accepts[Dims, Shape]
    block: Accepts[Dims, Shape]

    @field_validator("grid", mode="before")
    @classmethod
    def _grid(cls, value: object) -> Dims:
        return grid_dims(value)

    @field_validator("block", mode="before")
    @classmethod
    def _block(cls, value: object) -> Dims:
        return block_dims(value)


class Launch(LaunchShape):
    """Launch ``name`` from ``kernel`` on ``grid`` x ``block``; the reply, a
    :class:`Launched`, comes when the GPU work has completed.

    ``name`` may be left out when the handle holds one kernel. ``grid`` and
    ``block`` are an int or 1 to 3 ints (missing dimensions are 1).
    ``args`` are device arrays (CuPy, anything with ``__cuda_array_interface__``
    or DLPack, e.g. torch CUDA tensors), passed as pointers to their first element
    (refused where that address is not a multiple of the array's element size: the
    kernel's loads would fault the device)
    and kept alive until the kernel has finished, and NumPy scalars
    (``np.float32(2.0)``, ``np.int32(n)``) whose size must match the kernel's
    parameter. Plain Python numbers are refused: their C type would be a guess.
    A raw device address passed as ``np.uint64`` goes as it is, unchecked: a kernel's
    image gives its parameters' sizes, not the types they point to, so there is no
    element size to check its alignment against (pass the array where you can).

    The kernel runs on ``stream`` (a CuPy stream) or on one of the actor's own streams.
    With ``after="current_stream"`` (the default) it first waits for the work already
    queued on CuPy's current stream (e.g. the kernel that filled an input): while that
    is CuPy's legacy default stream, by running on the actor's blocking "ordered"
    stream, which CUDA orders after it (and later legacy-stream work after the
    kernel); otherwise through an event. ``"none"`` launches at once, on the actor's
    non-blocking stream. The table in docs/configuration.md has every case.

    ``timed=True`` records CUDA timing events around the kernel and reports its GPU
    time in :attr:`Launched.elapsed_us`; it costs 3 to 5 us a launch on an H200, so it
    is off by default.
    """

    kernel: KernelHandle
    name: str | None = None
    args: Accepts[Arguments, list[Any]] = Accepts(())
    shared_mem: Accepts[WholeNumber, SupportsIndex] = Field(default=Accepts(0), ge=0)
    stream: Any = None
    after: Literal["current_stream", "none"] = "current_stream"
    timed: Flag = False


class Launched(Reply):
    """A launch completed on the GPU."""

    #: The kernel name as requested (``"scale<float>"``) and the symbol launched.
    name: str
    symbol: str
    #: GPU time between CUDA events recorded around the launch, in microseconds;
    #: None unless the launch asked for it (``Launch(timed=True)``).
    elapsed_us: float | None = None
