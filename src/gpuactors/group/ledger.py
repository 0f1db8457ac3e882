"""The group's record of the op versions its engines hold, and the ones they point at.

Every engine of a group gets the same changes in the same order, so one record
describes them all, until a change ends with the engines pointing a name at different
versions (a split): its last phase reached some engines only (PartialFailure), or a
Rollback took each engine back along a history of its own. The record then holds each
engine's version, until a change brings every engine to one version again. While the
engines switch (phase 3, until each has answered), the record holds a split too: each
engine may point at the version before or after. The group
needs it to refuse a bad change before any engine sees it, to give ReplaceOp's new
version one number and one base on every engine, to know each op's parameters when
it splits a batch, and to say which version each engine serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuactors.engine.messages import ReplaceOp
from gpuactors.engine.ops import BUILTIN_OPS, OpSpec
from gpuactors.errors import EngineError, InvalidArgument, UnknownOp

#: The versions an engine may point a name at: one, unless the answer to a change that
#: engine was sent was lost (it may or may not have made it).
Candidates = frozenset[int]


class OpLedger:
    """Installed versions and the active one, per op name (as each engine keeps them:
    the built-ins unless a user op takes the name, then the start's ops, then installs)."""

    def __init__(self, ops: Sequence[OpSpec]) -> None:
        #: The versions every engine holds.
        self._versions: dict[str, dict[int, OpSpec]] = {}
        #: The version each name points at on every engine (names not split).
        self._active: dict[str, int] = {}
        #: Names the engines point at different versions: each engine's candidates.
        self._split: dict[str, dict[int, Candidates]] = {}
        #: The highest version number of each op that any engine may hold, installed on
        #: all of them or, after a change that failed part-way, on some.
        self._taken: dict[str, int] = {}
        user_names = [op.name for op in ops]
        if len(set(user_names)) != len(user_names):
            raise InvalidArgument(f"an op is declared twice: {sorted(user_names)}")
        for op in (*(op for op in BUILTIN_OPS if op.name not in user_names), *ops):
            self.installed(op)
            self.point(op.name, op.version)

    # ----------------------------------------------------------------- queries
    def spec(self, name: str) -> OpSpec:
        """The version ``name`` points at. Split, the newest version it may point at,
        as long as all of them take the same parameters (which is all a batch is split
        by); EngineError where they do not."""
        version = self._active.get(name)
        if version is not None:
            return self._version(name, version)
        specs = self._live_specs(name)
        if any(spec.params != specs[0].params for spec in specs):
            raise EngineError(
                f"op {name!r} is split over the engines ({self._describe(name)}) into versions "
                "with different parameters: a batch cannot be split by them until every "
                "engine points at one version (once a change under way ends, or by alias)"
            )
        return specs[-1]

    def knows(self, name: str) -> bool:
        return name in self._active or name in self._split

    def check_known(self, name: str) -> None:
        if not self.knows(name):
            known = ", ".join(sorted((*self._active, *self._split)))
            raise UnknownOp(f"no op {name!r} in this group (ops: {known})")

    def has(self, name: str, version: int) -> bool:
        return version in self._versions.get(name, {})

    def check_new(self, op: OpSpec) -> None:
        if self.has(op.name, op.version):
            raise InvalidArgument(f"op {op.name!r} version {op.version} is installed already")

    def replacement(self, msg: ReplaceOp) -> OpSpec:
        """The next version of ``msg.name`` with its new body (and parameters): past
        every number an engine may hold, so a change that failed part-way does not
        leave a number each later replacement would collide with. Split, its base is
        every version the name may point at, which must give one replacement."""
        self.check_known(msg.name)
        number = self._taken[msg.name] + 1
        made = [msg.applied_to(base, number) for base in self._live_specs(msg.name)]
        if any(spec != made[0] for spec in made):
            raise EngineError(
                f"op {msg.name!r} is split over the engines ({self._describe(msg.name)}) into "
                "versions that differ in more than the body, so a replacement would differ "
                "by engine: give its params (and multi_block), or point every engine at one "
                "version first (alias)"
            )
        return made[0]

    def on(self, name: str, key: int) -> Candidates:
        """The versions engine ``key`` may point ``name`` at (none: a name it lacks)."""
        version = self._active.get(name)
        if version is not None:
            return frozenset((version,))
        split = self._split.get(name)
        if split is None:
            return frozenset()
        return split.get(key, self.every_version(name))

    def every_version(self, name: str) -> Candidates:
        return frozenset(self._versions.get(name, {}))

    def live(self, name: str, keys: Iterable[int]) -> dict[int, int | None]:
        """The version ``name`` points at on each engine of ``keys`` (None: the answer to
        a change was lost, or has not come yet, and it points at one of the versions that
        change could leave; ``switch.py`` asks where it points an engine whose answer was
        lost)."""
        self.check_known(name)
        return {key: _one(self.on(name, key)) for key in keys}

    def agreed(self) -> dict[str, int]:
        """Every name the engines agree on, and its version."""
        return dict(self._active)

    def splits(self) -> dict[str, dict[int, int | None]]:
        """Every split name, and each engine's version (None: see :meth:`live`)."""
        return {name: {k: _one(c) for k, c in on.items()} for name, on in self._split.items()}

    # ----------------------------------------------------------------- changes
    def take_number(self, op: OpSpec) -> None:
        """Some engine holds ``op`` now: its version number is taken."""
        self._taken[op.name] = max(self._taken.get(op.name, 0), op.version)

    def installed(self, op: OpSpec) -> None:
        """Every engine holds ``op`` now (a new name: each points it at this, its first
        version, as an engine does)."""
        self._versions.setdefault(op.name, {})[op.version] = op
        self.take_number(op)
        if not self.knows(op.name):
            self._active[op.name] = op.version

    def point(self, name: str, version: int) -> None:
        """Every engine points ``name`` at ``version`` now: a split is healed."""
        self._active[name] = version
        self._split.pop(name, None)

    def pointed(self, name: str, now: Mapping[int, Candidates]) -> None:
        """Engine ``key`` points ``name`` at one of ``now[key]``, for every engine asked;
        where that is one version on every engine, the name is no longer split."""
        outcomes = set(now.values())
        if len(outcomes) == 1 and len(only := outcomes.pop()) == 1:
            self.point(name, next(iter(only)))
            return
        self._active.pop(name, None)
        self._split[name] = dict(now)

    # ----------------------------------------------------------------- helpers
    def _version(self, name: str, version: int) -> OpSpec:
        try:
            return self._versions[name][version]
        except KeyError:  # (only an engine changed around the group can point there)
            raise EngineError(
                f"an engine points op {name!r} at v{version}, which the group did not install "
                "on every engine"
            ) from None

    def _live_specs(self, name: str) -> list[OpSpec]:
        """Every version ``name`` may point at on some engine, oldest first."""
        self.check_known(name)
        version = self._active.get(name)
        if version is not None:
            return [self._version(name, version)]
        versions: set[int] = set().union(*self._split[name].values())
        return [self._version(name, v) for v in sorted(versions)]

    def _describe(self, name: str) -> str:
        live = self.splits().get(name, {})
        return ", ".join(f"{key}: {'unknown' if v is None else f'v{v}'}" for key, v in live.items())


def _one(candidates: Candidates) -> int | None:
    return next(iter(candidates)) if len(candidates) == 1 else None
