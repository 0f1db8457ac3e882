"""Which files NVRTC read for a request, as NVRTC itself reports them.

A cache key that guesses a source's includes by pattern-matching misses the spellings
it does not know (``%:include``, line splices, ``#include MACRO``...) and hands back a
stale binary. So the key is built the way ccache's direct mode builds it: a
*request key* over what the caller hands over, and a *manifest*, recorded at the
compile, of the files the compiler read; the full key adds each listed file's content.

The dependencies come from NVRTC itself (see ``discovery.py``): every header its
front end read, by the path it opened or the in-memory header's name.

Besides its dependencies a manifest lists *probes*: paths where a new file would
change what NVRTC reads (the same include name in an earlier folder of the search, and
every candidate the include scan looked at). The key records whether each exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Manifest:
    """The files one compile read (``deps``) and the paths where a new file would have
    changed that (``probes``), both as NVRTC names them; sorted, no repeats."""

    deps: tuple[str, ...]
    probes: tuple[str, ...]


def _shadowing_candidates(dep: str, roots: Sequence[str]) -> Iterable[str]:
    """Where the include that found ``dep`` under one of ``roots`` could have been found
    under another: a file created there could be read instead."""
    path = os.path.normpath(dep)
    for root in roots:
        if os.path.isabs(path) != os.path.isabs(root or "."):
            continue
        prefix = os.path.normpath(root) if root else "."
        if prefix == ".":
            relative = path
        elif path.startswith(prefix.rstrip(os.sep) + os.sep):
            relative = path[len(prefix.rstrip(os.sep)) + 1 :]
        else:
            continue
        for other in roots:
            candidate = os.path.normpath(os.path.join(other, relative))
            if candidate != path:
                yield candidate


def make_manifest(
    deps: Sequence[str], *, probed: Iterable[str], name: str, include_paths: Sequence[str]
) -> Manifest:
    """The manifest of a compile that read ``deps``; ``probed`` are the include scan's
    candidates. The search folders are the program's, the include paths, and the folder
    of every dependency (quoted includes look next to the including file first)."""
    roots = list(
        dict.fromkeys([os.path.dirname(name), *include_paths, *(os.path.dirname(d) for d in deps)])
    )
    probes = set(probed)
    for dep in deps:
        probes.update(_shadowing_candidates(dep, roots))
    probes.difference_update(deps)
    probes.difference_update(os.path.normpath(d) for d in deps)
    return Manifest(deps=tuple(sorted(set(deps))), probes=tuple(sorted(probes)))
