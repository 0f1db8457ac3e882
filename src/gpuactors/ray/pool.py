"""Start a pool of Ray actors, one engine each (one per GPU by default), as an EngineGroup.

The pool is an :class:`~gpuactors.group.EngineGroup` whose members are Ray actors,
so it takes the same typed messages and keeps the same rules: a task goes to the
actor that holds its RemoteArrays (host data goes by value, to the least-loaded
actor), a batch is split by where its tasks' data lives (or goes whole to the actor
that holds all of it), and op changes reach every
actor in three phases. Keys are actor indices (0, 1, ...).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import ray

from gpuactors.actors.checks import count, optional_count, optional_seconds
from gpuactors.engine import EngineConfig, OpSpec, Stats
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.errors import EngineError, GpuActorsError, InvalidArgument, NoCudaDevice
from gpuactors.group import EngineGroup, Placement
from gpuactors.group.placement import check_placement
from gpuactors.logs import get_logger
from gpuactors.numeric import real_number
from gpuactors.ray.host import EngineHost, HostSpec, StartMember
from gpuactors.ray.member import RayMember
from gpuactors.worker import IsolationConfig

log = get_logger(component="ray")


async def start_ray_pool(
    *,
    actors: int | None = None,
    ops: Sequence[OpSpec] = (),
    config: EngineConfig | None = None,
    isolation: IsolationConfig | None = None,
    full_policy: Literal["wait", "fail"] = "wait",
    num_gpus: float = 1.0,
    max_restarts: int = 3,
    idempotent_ops: Iterable[str] = (),
    placement: Placement = "least_loaded",
    actor_options: Mapping[str, Any] | None = None,
    start_member: StartMember | None = None,
    link: bool | None = None,
    start_timeout: float | None = 600.0,
) -> EngineGroup:
    """Start ``actors`` Ray actors (default: one per GPU of the cluster), each with
    ``num_gpus`` and an engine with ``ops``, and return them as one group.

    ``max_restarts``: how often Ray starts a lost actor anew (-1: with no limit).
    ``idempotent_ops``: ops whose tasks may run twice (Ray sends them again after a
    loss, for as long as the actor may come back); every other call is sent at most
    once. ``isolation``: each actor runs its engine in a worker process of its own
    (device faults are recovered inside the actor); default: in the actor's process (a
    fault ends the actor, and Ray restarts it). ``actor_options`` go to Ray as they are
    (``resources``, ``scheduling_strategy``), but for those the pool sets from its
    own arguments (``num_gpus``, ``max_restarts``, ``max_task_retries``). ``link``:
    batches go to each actor over a TCP connection of their own
    (:mod:`gpuactors.worker.link`), which costs far less per batch than a Ray call;
    False sends them through Ray calls. Default: a link
    unless Ray runs with TLS (``RAY_USE_TLS``), as the link's traffic is not encrypted.
    ``start_timeout``: seconds for every actor to be placed and its engine started
    (compiles included); then the actors are ended and NoCudaDevice (the cluster lacks
    the GPUs asked for) or EngineError is raised. None waits as long as Ray does (for
    an autoscaler, say). Call ``ray.init()`` first.
    """
    options = _own_actor_options(actor_options)
    if not ray.is_initialized():
        raise InvalidArgument("call ray.init() (or ray.init(address=...)) before start_ray_pool")
    max_restarts = count(max_restarts, "max_restarts", -1)  # (-1: without limit, as Ray has it)
    start_timeout = optional_seconds(start_timeout, "start_timeout")
    num_gpus = _gpus_each(num_gpus)
    check_placement(placement)  # (the group would refuse it once every actor had started)
    actors = optional_count(actors, "actors", 1)
    idempotent = _op_names(idempotent_ops, ops)
    gpus = float(ray.cluster_resources().get("GPU", 0.0))  # type: ignore[no-untyped-call, unused-ignore]
    if actors is None:
        actors = int(gpus // num_gpus) if num_gpus > 0 else 0
        if actors < 1:
            raise InvalidArgument(
                f"the cluster has {gpus:g} GPUs: not one actor of {num_gpus:g} GPUs fits (pass "
                "actors= to choose)"
            )
    spec = HostSpec(
        ops=tuple(ops),
        config=config,
        isolation=isolation,
        full_policy=full_policy,
        start_member=start_member,
    )
    options |= {"num_gpus": num_gpus, "max_restarts": max_restarts}
    host = ray.remote(EngineHost).options(**options)
    if link is None:
        link = os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true")
    members = [
        RayMember(host.remote(spec), key, idempotent=idempotent, link=link) for key in range(actors)
    ]
    try:
        await asyncio.wait_for(_started(members), start_timeout)
        # (inside: a group that cannot be made must not leave its actors running)
        return EngineGroup(members, ops=ops, placement=placement, noun="actor")
    except BaseException as exc:
        for member in members:
            ray.kill(member.actor, no_restart=True)
        if not isinstance(exc, asyncio.TimeoutError) or isinstance(exc, GpuActorsError):
            raise
        wanted = actors * num_gpus
        if gpus < wanted:
            raise NoCudaDevice(
                f"{actors} actors of {num_gpus:g} GPUs each need {wanted:g} GPUs; the cluster "
                f"has {gpus:g}, and Ray had not placed them after {start_timeout:g} s"
            ) from None
        raise EngineError(
            f"the pool's {actors} actors did not start within {start_timeout:g} s (Ray "
            "could not place them, or their engines were still starting)"
        ) from None


#: Ray actor options the pool sets itself, each with the argument that says it.
_POOL_OPTIONS = {
    "num_gpus": "num_gpus=",
    "max_restarts": "max_restarts=",
    "max_task_retries": "idempotent_ops= (the ops whose calls Ray may send again)",
}


def _own_actor_options(actor_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``actor_options`` for Ray, refused where they name an option the pool sets: it
    would silently undo the pool's own (``max_task_retries`` would send every call
    again after a loss, where only idempotent ops' calls may be)."""
    options = dict(actor_options or {})
    for key, argument in _POOL_OPTIONS.items():
        if key in options:
            raise InvalidArgument(f"actor_options may not set {key!r}: pass {argument}")
    return options


async def _started(members: Sequence[RayMember]) -> None:
    """Every member's engine answers: the first compiles the op set, the others then
    find it in their node's kernel cache."""
    await members[0].ask(Stats())
    await asyncio.gather(*(member.ask(Stats()) for member in members[1:]))


def _gpus_each(value: object) -> float:
    """``num_gpus`` as Ray takes it: a finite number of GPUs, 0 or more."""
    gpus = real_number(value)
    if gpus is None or not 0 <= gpus < float("inf"):
        raise InvalidArgument(f"num_gpus must be a finite number >= 0, not {value!r}")
    return gpus


def _op_names(names: Iterable[str], ops: Sequence[OpSpec]) -> frozenset[str]:
    """``idempotent_ops`` as a set of op names (one string would be a set of letters)."""
    if isinstance(names, str):
        raise InvalidArgument(f"idempotent_ops takes op names, not one string: ({names!r},)")
    chosen = frozenset(names)
    for name in chosen:
        if not isinstance(name, str):
            raise InvalidArgument(f"idempotent_ops takes op names (str), not {name!r}")
    known = {op.name for op in (*BUILTIN_OPS, *ops)}
    if chosen - known:  # (maybe ops installed later: only a warning)
        log.warning("idempotent_ops names ops the pool does not have", ops=sorted(chosen - known))
    return chosen
