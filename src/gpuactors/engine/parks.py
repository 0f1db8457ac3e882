"""The Parks that hold an engine's kernel parked, each released exactly once.

A Park's hold ends one way only, whichever comes first: its wait fails (a timeout,
a fault, the engine stopping), its asker leaves before it answers (cancelled, timed
out: the Park then holds nothing), or its Resume comes. Counting instead would let
two of these end one Park twice, and the second would end another Park's hold.

A Park named by its asker (``Park(hold=n)``) is ended by ``Resume(hold=n)`` only,
which does nothing once that Park has ended: so a caller cancelled just as its Park
answered (it never saw the reply) can always send it. An unnamed Park, once it has
answered, is ended by any plain ``Resume``.
"""

from __future__ import annotations

from gpuactors.errors import InvalidArgument


class ParkHolds:
    """The Parks holding the kernel, each under a key of its own (a named one too: a
    name is free again once its Park has ended, and that Park's wait, which ends its
    own hold if it fails or its asker leaves, must not end a later Park of the name)."""

    def __init__(self) -> None:
        self._held: dict[object, bool] = {}  # key -> may a plain Resume end it?
        self._named: dict[int, object] = {}  # name -> the key of the Park holding it

    def __len__(self) -> int:
        return len(self._held)

    def take(self, name: int | None) -> object:
        """A new Park holds the kernel; its key ends it. A name still holding is refused
        (its Resume could not tell the two apart)."""
        if name is not None and name in self._named:
            raise InvalidArgument(f"a Park named {name} already holds this engine")
        key = object()
        self._held[key] = False
        if name is not None:
            self._named[name] = key
        return key

    def answered(self, key: object) -> None:
        """The Park of ``key`` has answered: an unnamed one is now any Resume's to end."""
        if key in self._held and key not in self._named.values():
            self._held[key] = True

    def release(self, key: object) -> None:
        """End the Park of ``key`` (nothing if it has ended already)."""
        if self._held.pop(key, None) is None:
            return
        for name, named in self._named.items():
            if named is key:
                del self._named[name]
                break

    def clear(self) -> None:
        """End every Park (a shutdown's drain needs the kernel; their Resumes may never
        come). A Park still waiting to answer then holds nothing either."""
        self._held.clear()
        self._named.clear()

    def resume(self, name: int | None) -> None:
        """A Resume: end the Park named ``name``, or, unnamed, one unnamed Park that has
        answered (a Park still waiting ends itself if it fails or its asker leaves)."""
        if name is not None:
            key = self._named.get(name)
        else:
            key = next((key for key, plain in self._held.items() if plain), None)
        if key is not None:
            self.release(key)
