"""The group's record of the op versions its engines hold.

Every engine of a group gets the same changes in the same order, so one record
describes them all. The group needs it to refuse a bad change before any engine
sees it, to give ReplaceOp's new version one number on every engine, and to know
each op's parameters when it splits a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuactors.engine.messages import ReplaceOp
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec
from gpuactors.errors import InvalidArgument, UnknownOp


class OpLedger:
    """Installed versions and the active one, per op name (as each engine keeps them:
    the built-ins unless a user op takes the name, then the start's ops, then installs)."""

    def __init__(self, ops: Sequence[OpSpec]) -> None:
        self._versions: dict[str, dict[int, OpSpec]] = {}
        self._active: dict[str, int] = {}
        #: The highest version number of each op that any engine may hold, installed on
        #: all of them or, after a change that failed part-way, on some.
        self._taken: dict[str, int] = {}
        user_names = [op.name for op in ops]
        if len(set(user_names)) != len(user_names):
            raise InvalidArgument(f"an op is declared twice: {sorted(user_names)}")
        for op in (*(op for op in BUILTIN_OPS if op.name not in user_names), *ops):
            self.record(op, activate=True)

    def spec(self, name: str) -> OpSpec:
        """The version ``name`` points at."""
        version = self._active.get(name)
        if version is None:
            known = ", ".join(sorted(self._active))
            raise UnknownOp(f"no op {name!r} in this group (ops: {known})")
        return self._versions[name][version]

    def knows(self, name: str) -> bool:
        return name in self._active

    def has(self, name: str, version: int) -> bool:
        return version in self._versions.get(name, {})

    def check_new(self, op: OpSpec) -> None:
        if self.has(op.name, op.version):
            raise InvalidArgument(f"op {op.name!r} version {op.version} is installed already")

    def replacement(self, msg: ReplaceOp) -> OpSpec:
        """The next version of ``msg.name`` with its new body (and parameters): past
        every number an engine may hold, so a change that failed part-way does not
        leave a number each later replacement would collide with."""
        current = self.spec(msg.name)
        return msg.applied_to(current, self._taken[msg.name] + 1)

    def take_number(self, op: OpSpec) -> None:
        """Some engine holds ``op`` now: its version number is taken."""
        self._taken[op.name] = max(self._taken.get(op.name, 0), op.version)

    def record(self, op: OpSpec, *, activate: bool) -> None:
        """Every engine holds ``op`` now (and points its name at it: ``activate``, or a new
        name, which an engine points at its first version)."""
        self._versions.setdefault(op.name, {})[op.version] = op
        self.take_number(op)
        if activate or op.name not in self._active:
            self._active[op.name] = op.version

    def point(self, name: str, version: int) -> None:
        self._active[name] = version
