"""Which engine a task belongs to: the device that holds its arrays.

An engine reads its arrays in place, so a task must go to the engine of the device
that holds them: a CuPy array (or any ``__cuda_array_interface__`` / DLPack array)
says its device; a RemoteArray lives in the engine that issued it. Host values
(NumPy arrays, which travel by value, and scalars) tie a task to no engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gpuactors.cuda import arrays as cuda_arrays
from gpuactors.cuda.arrays import describe_array
from gpuactors.errors import InvalidArgument, WrongDevice
from gpuactors.group.sharded import PerDevice, Shard, ShardedArray
from gpuactors.numeric import whole_number
from gpuactors.worker.messages import RemoteArray

_HOST_SCALARS = (int, float, bool, complex, np.generic, np.ndarray)


class Locator:
    """Finds the engine (by key: a device id, or a Ray actor's index) that holds a value."""

    def __init__(self, keys: Iterable[int], noun: str = "device") -> None:
        self.keys = frozenset(keys)
        self.noun = noun  # what a key names, in messages: "device", or "actor" in a Ray pool
        self._owners: dict[str, int] = {}  # RemoteArray.owner -> engine key

    def given(self, key: object) -> int:
        """A key the caller gave (``device=``): a whole number by the library's rule (a
        NumPy integer too; never a bool, which would pass for engine 0 or 1)."""
        number = whole_number(key)
        if number is None:
            raise InvalidArgument(f"a {self.noun} is named by its number (an int), not {key!r}")
        return number

    def learn(self, remote: RemoteArray, key: int) -> None:
        """Engine ``key`` issued ``remote``: its later arrays carry the same owner."""
        self._owners[remote.owner] = key

    def key_of(self, value: Any, what: str = "an argument") -> int | None:
        """The engine that holds ``value``, or None for a host value that any engine takes."""
        kind = type(value)
        # (Read from its module at each call, as the engine's modules read it: a stand-in
        # for CuPy's type, as the host-path benchmark runs, is then taken for it here too.)
        ndarray = cuda_arrays.cupy_ndarray()
        if ndarray is not None and kind is ndarray:
            return int(value.data.device_id)
        if isinstance(value, _HOST_SCALARS) or value is None:
            return None
        if isinstance(value, RemoteArray):
            key = self._owners.get(value.owner)
            if key is None:
                raise InvalidArgument(
                    f"{what} is a RemoteArray of an engine outside this group (owner "
                    f"{value.owner[:8] or '?'}): upload arrays through the group"
                )
            return key
        if isinstance(value, ShardedArray | PerDevice):
            raise InvalidArgument(
                f"{what} is a {kind.__name__}: one task runs on one engine; pass the array of "
                f"one {self.noun}, or send the tasks as an EnqueueBatch, which the group splits"
            )
        if hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"):
            return describe_array(value, what).device_id
        return None  # not an array the group knows: the engine says what is wrong with it

    def check_shard(self, shard: Shard, what: str) -> None:
        """WrongDevice unless ``shard``'s array lives on the engine the shard names (a
        ShardedArray built by hand may say otherwise, and that engine would be asked for
        what it does not hold). ``what``: the array, in the message."""
        noun = self.noun
        where = f"the shard of {what} for {noun} {shard.device}"
        held = self.key_of(shard.array, where)
        if held is not None and held != shard.device:
            raise WrongDevice(f"{where} holds an array that lives on {noun} {held}")

    def task_key(self, args: Sequence[Any], chosen: int | None = None) -> int | None:
        """The one engine every array of a task lives on (``chosen``: the caller's pick,
        which the arrays must agree with); None when no argument ties the task to one.
        WrongDevice for arrays on two devices, or on a device outside the group: refused
        before anything reaches an engine."""
        found, noun = (None if chosen is None else self.given(chosen)), self.noun
        source = "the task was sent to"
        for position, arg in enumerate(args):
            key = self.key_of(arg, f"argument {position}")
            if key is None or key == found:
                continue
            if found is not None:
                raise WrongDevice(
                    f"argument {position} lives on {noun} {key} but {source} {noun} {found}: "
                    f"one task runs on one {noun}, so all its arrays must live there"
                )
            found, source = key, f"argument {position} lives on"
        if found is not None and found not in self.keys:
            raise WrongDevice(
                f"{noun} {found} has no engine in this group ({noun}s {sorted(self.keys)})"
            )
        return found
