"""Straight-line Python functions written for one argument signature.

The launch packers (:mod:`gpuactors.nvrtc.packers`), the engine's word encoders
(:mod:`gpuactors.engine.word_encoders`) and publishers
(:mod:`gpuactors.engine.publishers`) each write, once per signature, a function
that unpacks a fixed number of arguments, checks their types, then checks what it
reads of them, and refuses (returns a given value) at the first doubt. This module
holds that shared head and the compiling, as ``dataclasses`` does for ``__init__``.
"""

from __future__ import annotations

import functools
from types import CodeType
from typing import Any


def checks_source(
    signature: str,
    arity: int,
    type_checks: list[str],
    loads: list[str],
    refusals: list[str],
    refuse: str,
) -> list[str]:
    """The first lines of ``def {signature}:``: refuse unless ``args`` has ``arity``
    items (bound to ``a0, a1, ...``) passing every type check; then ``loads``; then
    refuse if any of ``refusals`` holds."""
    lines = [f"def {signature}:", f"    if len(args) != {arity}:", f"        return {refuse}"]
    if arity:
        lines.append(f"    {', '.join(f'a{index}' for index in range(arity))}, = args")
        lines += [f"    if {' or '.join(type_checks)}:", f"        return {refuse}"]
    lines += loads
    if refusals:
        lines += [f"    if {' or '.join(refusals)}:", f"        return {refuse}"]
    return lines


def compile_function(source: str, filename: str, namespace: dict[str, Any], name: str) -> Any:
    """The function ``name`` that ``source`` defines, its globals ``namespace``.

    The compiled code is kept per source and file name (which names the op): a new
    version of an op with the same signature (a hot swap) gets its functions without
    compiling again, while its tasks wait for the swap."""
    exec(_compiled(source, filename), namespace)
    return namespace[name]


@functools.lru_cache(maxsize=512)
def _compiled(source: str, filename: str) -> CodeType:
    return compile(source, filename, "exec")
