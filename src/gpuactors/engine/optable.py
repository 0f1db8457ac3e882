"""The engine's op table: logical names, their versions, aliases and stable op ids.

* Every installed version of an op is a *physical* op (``name@version``) with an
  op id that never changes and is never reused, so a record already in the ring
  means the same thing in every later engine module.
* A logical name maps to one active version (the alias). Switching it is a
  table update: no recompile, no park. The previous versions form a stack that
  :meth:`rollback` pops.
* The version of a task is bound when the engine accepts it: a task accepted
  before an alias switch runs the old version even if the device claims it
  later; a task accepted after the switch runs the new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuactors.cuda.arrays import cupy_ndarray
from gpuactors.engine.args import ArgEncoder
from gpuactors.engine.codegen import physical_key
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.publishers import Publisher, publisher
from gpuactors.errors import InvalidArgument, UnknownOp


@dataclass(frozen=True)
class ResolvedOp:
    """What an accepted task is bound to."""

    spec: OpSpec
    op_id: int
    encoder: ArgEncoder
    #: The latency path's straight-line publisher (None without CuPy).
    publish: Publisher | None


@dataclass(frozen=True)
class OpCodecs:
    """A new op version's id and the functions that take time to build (its argument
    encoder and publisher): :meth:`OpTable.codecs_for` builds them while the engine
    still serves, so the hot swap's park does not wait for them."""

    op: OpSpec
    op_id: int
    encoder: ArgEncoder
    publish: Publisher | None


class OpTable:
    """Versions, aliases and op ids of one engine (owned by its actor, not thread-safe)."""

    def __init__(self, ops: Iterable[OpSpec]) -> None:
        self._versions: dict[str, dict[int, OpSpec]] = {}
        self._ids: dict[str, int] = {}
        self._encoders: dict[str, ArgEncoder] = {}
        self._publishers: dict[str, Publisher | None] = {}
        self._active: dict[str, int] = {}
        self._history: dict[str, list[int]] = {}
        self._resolved: dict[str, ResolvedOp] = {}  # per name, until its alias moves
        #: The resolutions made so far, by op name: a name found here resolves to what
        #: it maps to (a hit costs the latency path no call); else call ``resolve``.
        #: A live view: ``_resolved`` is only ever changed in place, never rebound.
        self.resolutions: Mapping[str, ResolvedOp] = self._resolved
        for op in ops:
            if op.name in self._versions:
                raise InvalidArgument(f"op {op.name!r} is declared twice")
            self.add(op, activate=True)

    # ----------------------------------------------------------------- queries
    def resolve(self, name: str) -> ResolvedOp:
        resolved = self._resolved.get(name)
        if resolved is not None:
            return resolved
        version = self._active.get(name)
        if version is None:
            raise UnknownOp(f"no op {name!r} in this engine (ops: {', '.join(self.names())})")
        spec = self._versions[name][version]
        key = physical_key(spec)
        resolved = self._resolved[name] = ResolvedOp(
            spec, self._ids[key], self._encoders[key], self._publishers[key]
        )
        return resolved

    def names(self) -> list[str]:
        return sorted(self._active)

    def versions(self, name: str) -> list[int]:
        return sorted(self._versions.get(name, {}))

    def active_version(self, name: str) -> int:
        self.resolve(name)
        return self._active[name]

    def physical_ops(self) -> list[OpSpec]:
        """Every installed version, in op-id order: what an engine module must contain."""
        by_id = sorted(
            (self._ids[physical_key(spec)], spec)
            for versions in self._versions.values()
            for spec in versions.values()
        )
        return [spec for _, spec in by_id]

    def op_ids(self) -> dict[str, int]:
        return dict(self._ids)

    def next_op_id(self) -> int:
        """The op id the next physical op (version) gets."""
        return max(self._ids.values(), default=-1) + 1

    def next_version(self, name: str) -> int:
        return max(self._versions.get(name, {}), default=0) + 1

    def planned(self, op: OpSpec) -> tuple[list[OpSpec], dict[str, int]]:
        """The physical ops and ids a module needs once ``op`` is added (nothing changes yet)."""
        self._check_new(op)
        ids = self.op_ids()
        ids[physical_key(op)] = self.next_op_id()
        return [*self.physical_ops(), op], ids

    def codecs_for(self, op: OpSpec) -> OpCodecs:
        """What :meth:`add` builds for ``op`` as the next op id (nothing changes yet)."""
        self._check_new(op)
        op_id = self.next_op_id()
        return OpCodecs(op, op_id, ArgEncoder(op), publisher(op, op_id, cupy_ndarray()))

    # ----------------------------------------------------------------- changes
    def add(self, op: OpSpec, *, activate: bool, codecs: OpCodecs | None = None) -> None:
        """Register a new version (its module must already be running); ``codecs``
        are its :meth:`codecs_for` (built again if they no longer fit)."""
        self._check_new(op)
        if codecs is None or codecs.op is not op or codecs.op_id != self.next_op_id():
            codecs = self.codecs_for(op)
        key = physical_key(op)
        self._ids[key] = codecs.op_id
        self._encoders[key] = codecs.encoder
        self._publishers[key] = codecs.publish
        self._versions.setdefault(op.name, {})[op.version] = op
        if activate or op.name not in self._active:
            self.alias(op.name, op.version)

    def alias(self, name: str, version: int) -> int | None:
        """Point ``name`` at ``version``; returns the version it pointed at before."""
        if version not in self._versions.get(name, {}):
            raise UnknownOp(f"op {name!r} has no version {version} (has {self.versions(name)})")
        previous = self._active.get(name)
        if previous is not None and previous != version:
            self._history.setdefault(name, []).append(previous)
        self._active[name] = version
        self._resolved.pop(name, None)
        return previous

    def rollback(self, name: str) -> tuple[int, int]:
        """Return ``name`` to the version before the current one: (now, was)."""
        current = self.active_version(name)
        history = self._history.get(name)
        if not history:
            raise InvalidArgument(f"op {name!r} has no earlier version to roll back to")
        self._active[name] = history.pop()
        self._resolved.pop(name, None)
        return self._active[name], current

    def _check_new(self, op: OpSpec) -> None:
        if op.version in self._versions.get(op.name, {}):
            raise InvalidArgument(
                f"op {op.name!r} version {op.version} is installed already; "
                f"the next free version is {self.next_version(op.name)}"
            )
