"""gpuactors: an asyncio actor runtime that owns NVIDIA GPUs.

Every name a service needs is importable from here: the actor core, every
message and reply of the NvrtcActor, the engine and the isolated engine, and
every error class. ``_EXPORTS`` below is the one table of those names. They
are loaded on first use (PEP 562), so ``import gpuactors`` stays light: it
imports no CuPy, cuda-bindings, NumPy or pydantic, and needs no GPU.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# module -> the names it gives the top level. The one table: __all__, dir() and
# the lazy lookup below derive from it; the TYPE_CHECKING block repeats it for
# type checkers (a test keeps the two equal).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "gpuactors.actors": (
        "Actor", "ActorContext", "ActorRef", "ActorSystem", "Backpressure", "DeadLetter",
        "DeadLetters", "Deferred", "Directive", "MailboxConfig", "Props",
        "SupervisorStrategy", "Terminated", "failed_reply", "handles", "reply_from",
        "restart_on_error",
    ),
    "gpuactors.messages": ("Ack", "Message", "Reply"),
    "gpuactors.nvrtc": (
        "CacheStats", "Compile", "CompileAsync", "CompiledModule", "CompilerStats",
        "CorruptEntry", "KernelCompiler", "KernelHandle", "Launch", "Launched", "NvrtcActor",
        "NvrtcOpts", "NvrtcStats", "OutputKind", "KernelReleased", "ReleaseKernel",
        "KernelLinker", "Link", "LinkAsync", "LinkInput", "LinkOpts", "LinkRequest",
    ),
    "gpuactors.engine": (
        "BUILTIN_OPS", "AliasOp", "ArrayParam", "BatchCompletion", "Completion", "Drain",
        "Drained", "Engine", "EngineConfig", "EngineStats", "Enqueue", "EnqueueBatch",
        "InstallOp", "OpAliasSet", "OpInstalled", "OpPrepared", "OpSpec", "Park", "Parked",
        "PersistentEngineActor", "PersistentThreadMode", "PrepareOp", "ReplaceOp", "Resume",
        "Rollback", "ScalarParam", "Shutdown", "ShutdownReport", "Stats", "DeviceLibrary",
    ),
    "gpuactors.worker": (
        "Download", "Downloaded", "Free", "Health", "IsolatedEngine", "IsolatedEngineActor",
        "IsolationConfig", "Job", "JobResult", "LaunchJob", "LaunchResult", "RemoteArray",
        "RemoteKernel", "Upload", "WorkerHealth", "ReleaseRemoteKernel",
    ),
    "gpuactors.errors": (
        "GpuActorsError", "ActorError", "AskTimeout", "MailboxFull", "ActorStopped",
        "ActorNotFound", "ActorNameTaken", "UnhandledMessage", "ActorFailed",
        "ShutdownTimeout", "InvalidArgument", "CompileError", "NvrtcUnavailable", "GpuError",
        "NoCudaDevice", "GpuRefStale", "WrongDevice", "LaunchError", "DeviceFault",
        "DeviceFailed", "EngineError", "UnknownOp", "QueueFull", "EngineStopped",
        "EngineModeError", "TaskFailed", "TaskTimeout", "TaskHung", "WorkerError",
        "WorkerProtocolError", "PartialFailure", "EngineLost", "LinkError", "LinkerUnavailable",
    ),
    "gpuactors.group": (
        "EngineGroup", "GroupAliasSet", "GroupBatchCompletion", "GroupOpInstalled",
        "GroupStats", "PerDevice", "ShardedArray",
    ),
    "gpuactors.cuda": ("cuda_device_count", "no_device_reason"),
    "gpuactors.cuda.device": (
        "ContextRebuilt", "DeviceActor", "DeviceInfo", "DeviceStatus", "GenerationChanged",
        "RebuildContext", "ReportFault", "WatchGeneration", "start_device",
    ),
    "gpuactors.cuda.done_word": ("DoneWordError",),
    "gpuactors.logs": ("configure_logging",),
}  # fmt: skip
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = ["__version__", *_WHERE]

if TYPE_CHECKING:
    # The "X as X" form tells mypy and pyright that each name is re-exported.
    from gpuactors.actors import Actor as Actor
    from gpuactors.actors import ActorContext as ActorContext
    from gpuactors.actors import ActorRef as ActorRef
    from gpuactors.actors import ActorSystem as ActorSystem
    from gpuactors.actors import Backpressure as Backpressure
    from gpuactors.actors import DeadLetter as DeadLetter
    from gpuactors.actors import DeadLetters as DeadLetters
    from gpuactors.actors import Deferred as Deferred
    from gpuactors.actors import Directive as Directive
    from gpuactors.actors import MailboxConfig as MailboxConfig
    from gpuactors.actors import Props as Props
    from gpuactors.actors import SupervisorStrategy as SupervisorStrategy
    from gpuactors.actors import Terminated as Terminated
    from gpuactors.actors import failed_reply as failed_reply
    from gpuactors.actors import handles as handles
    from gpuactors.actors import reply_from as reply_from
    from gpuactors.actors import restart_on_error as restart_on_error
    from gpuactors.cuda import cuda_device_count as cuda_device_count
    from gpuactors.cuda import no_device_reason as no_device_reason
    from gpuactors.cuda.device import ContextRebuilt as ContextRebuilt
    from gpuactors.cuda.device import DeviceActor as DeviceActor
    from gpuactors.cuda.device import DeviceInfo as DeviceInfo
    from gpuactors.cuda.device import DeviceStatus as DeviceStatus
    from gpuactors.cuda.device import GenerationChanged as GenerationChanged
    from gpuactors.cuda.device import RebuildContext as RebuildContext
    from gpuactors.cuda.device import ReportFault as ReportFault
    from gpuactors.cuda.device import WatchGeneration as WatchGeneration
    from gpuactors.cuda.device import start_device as start_device
    from gpuactors.cuda.done_word import DoneWordError as DoneWordError
    from gpuactors.engine import BUILTIN_OPS as BUILTIN_OPS
    from gpuactors.engine import AliasOp as AliasOp
    from gpuactors.engine import ArrayParam as ArrayParam
    from gpuactors.engine import BatchCompletion as BatchCompletion
    from gpuactors.engine import Completion as Completion
    from gpuactors.engine import DeviceLibrary as DeviceLibrary
    from gpuactors.engine import Drain as Drain
    from gpuactors.engine import Drained as Drained
    from gpuactors.engine import Engine as Engine
    from gpuactors.engine import EngineConfig as EngineConfig
    from gpuactors.engine import EngineStats as EngineStats
    from gpuactors.engine import Enqueue as Enqueue
    from gpuactors.engine import EnqueueBatch as EnqueueBatch
    from gpuactors.engine import InstallOp as InstallOp
    from gpuactors.engine import OpAliasSet as OpAliasSet
    from gpuactors.engine import OpInstalled as OpInstalled
    from gpuactors.engine import OpPrepared as OpPrepared
    from gpuactors.engine import OpSpec as OpSpec
    from gpuactors.engine import Park as Park
    from gpuactors.engine import Parked as Parked
    from gpuactors.engine import PersistentEngineActor as PersistentEngineActor
    from gpuactors.engine import PersistentThreadMode as PersistentThreadMode
    from gpuactors.engine import PrepareOp as PrepareOp
    from gpuactors.engine import ReplaceOp as ReplaceOp
    from gpuactors.engine import Resume as Resume
    from gpuactors.engine import Rollback as Rollback
    from gpuactors.engine import ScalarParam as ScalarParam
    from gpuactors.engine import Shutdown as Shutdown
    from gpuactors.engine import ShutdownReport as ShutdownReport
    from gpuactors.engine import Stats as Stats
    from gpuactors.errors import ActorError as ActorError
    from gpuactors.errors import ActorFailed as ActorFailed
    from gpuactors.errors import ActorNameTaken as ActorNameTaken
    from gpuactors.errors import ActorNotFound as ActorNotFound
    from gpuactors.errors import ActorStopped as ActorStopped
    from gpuactors.errors import AskTimeout as AskTimeout
    from gpuactors.errors import CompileError as CompileError
    from gpuactors.errors import DeviceFailed as DeviceFailed
    from gpuactors.errors import DeviceFault as DeviceFault
    from gpuactors.errors import EngineError as EngineError
    from gpuactors.errors import EngineLost as EngineLost
    from gpuactors.errors import EngineModeError as EngineModeError
    from gpuactors.errors import EngineStopped as EngineStopped
    from gpuactors.errors import GpuActorsError as GpuActorsError
    from gpuactors.errors import GpuError as GpuError
    from gpuactors.errors import GpuRefStale as GpuRefStale
    from gpuactors.errors import InvalidArgument as InvalidArgument
    from gpuactors.errors import LaunchError as LaunchError
    from gpuactors.errors import LinkError as LinkError
    from gpuactors.errors import LinkerUnavailable as LinkerUnavailable
    from gpuactors.errors import MailboxFull as MailboxFull
    from gpuactors.errors import NoCudaDevice as NoCudaDevice
    from gpuactors.errors import NvrtcUnavailable as NvrtcUnavailable
    from gpuactors.errors import PartialFailure as PartialFailure
    from gpuactors.errors import QueueFull as QueueFull
    from gpuactors.errors import ShutdownTimeout as ShutdownTimeout
    from gpuactors.errors import TaskFailed as TaskFailed
    from gpuactors.errors import TaskHung as TaskHung
    from gpuactors.errors import TaskTimeout as TaskTimeout
    from gpuactors.errors import UnhandledMessage as UnhandledMessage
    from gpuactors.errors import UnknownOp as UnknownOp
    from gpuactors.errors import WorkerError as WorkerError
    from gpuactors.errors import WorkerProtocolError as WorkerProtocolError
    from gpuactors.errors import WrongDevice as WrongDevice
    from gpuactors.group import EngineGroup as EngineGroup
    from gpuactors.group import GroupAliasSet as GroupAliasSet
    from gpuactors.group import GroupBatchCompletion as GroupBatchCompletion
    from gpuactors.group import GroupOpInstalled as GroupOpInstalled
    from gpuactors.group import GroupStats as GroupStats
    from gpuactors.group import PerDevice as PerDevice
    from gpuactors.group import ShardedArray as ShardedArray
    from gpuactors.logs import configure_logging as configure_logging
    from gpuactors.messages import Ack as Ack
    from gpuactors.messages import Message as Message
    from gpuactors.messages import Reply as Reply
    from gpuactors.nvrtc import CacheStats as CacheStats
    from gpuactors.nvrtc import Compile as Compile
    from gpuactors.nvrtc import CompileAsync as CompileAsync
    from gpuactors.nvrtc import CompiledModule as CompiledModule
    from gpuactors.nvrtc import CompilerStats as CompilerStats
    from gpuactors.nvrtc import CorruptEntry as CorruptEntry
    from gpuactors.nvrtc import KernelCompiler as KernelCompiler
    from gpuactors.nvrtc import KernelHandle as KernelHandle
    from gpuactors.nvrtc import KernelLinker as KernelLinker
    from gpuactors.nvrtc import KernelReleased as KernelReleased
    from gpuactors.nvrtc import Launch as Launch
    from gpuactors.nvrtc import Launched as Launched
    from gpuactors.nvrtc import Link as Link
    from gpuactors.nvrtc import LinkAsync as LinkAsync
    from gpuactors.nvrtc import LinkInput as LinkInput
    from gpuactors.nvrtc import LinkOpts as LinkOpts
    from gpuactors.nvrtc import LinkRequest as LinkRequest
    from gpuactors.nvrtc import NvrtcActor as NvrtcActor
    from gpuactors.nvrtc import NvrtcOpts as NvrtcOpts
    from gpuactors.nvrtc import NvrtcStats as NvrtcStats
    from gpuactors.nvrtc import OutputKind as OutputKind
    from gpuactors.nvrtc import ReleaseKernel as ReleaseKernel
    from gpuactors.worker import Download as Download
    from gpuactors.worker import Downloaded as Downloaded
    from gpuactors.worker import Free as Free
    from gpuactors.worker import Health as Health
    from gpuactors.worker import IsolatedEngine as IsolatedEngine
    from gpuactors.worker import IsolatedEngineActor as IsolatedEngineActor
    from gpuactors.worker import IsolationConfig as IsolationConfig
    from gpuactors.worker import Job as Job
    from gpuactors.worker import JobResult as JobResult
    from gpuactors.worker import LaunchJob as LaunchJob
    from gpuactors.worker import LaunchResult as LaunchResult
    from gpuactors.worker import ReleaseRemoteKernel as ReleaseRemoteKernel
    from gpuactors.worker import RemoteArray as RemoteArray
    from gpuactors.worker import RemoteKernel as RemoteKernel
    from gpuactors.worker import Upload as Upload
    from gpuactors.worker import WorkerHealth as WorkerHealth


if not TYPE_CHECKING:  # type checkers read the imports above: a typo stays an error for them

    def __getattr__(name: str) -> Any:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'gpuactors' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found once; later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
