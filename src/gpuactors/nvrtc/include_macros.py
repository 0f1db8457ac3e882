"""Working out which files an include names through a macro (``#include HEADER``).

NVRTC blocks for good on opening a FIFO, so the include scan (``headers.py``) must see
every file an include can open, those whose name a macro builds too: ``#define HEADER
"pipe.h"`` then ``#include HEADER``, a function-like macro that stringizes or pastes
the name, ``__has_include(HEADER)``. This module expands such an operand the way the
preprocessor does (object-like and function-like macros, ``#``, ``##``, variadic
arguments, rescanning), with the macros of every text the scan read and the caller's
``-D`` defines.

The scan does not evaluate ``#if``, so a name may have several definitions, or none
where the include stands: every definition is tried, and so is the name left as it is.
The result is every name the include could open, a superset of NVRTC's choice. Where
the scan cannot bound that set (a name the compiler itself may define, like
``__CUDA_ARCH__``; more alternatives than :data:`MAX_ALTERNATIVES`), :class:`Unresolved`
says why: opening an unchecked name could hang the compile.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: The most names one include may resolve to (each definition of each macro doubles them).
MAX_ALTERNATIVES = 256
#: The most macro replacements, and the deepest nesting, one operand may take.
MAX_STEPS = 20_000
MAX_DEPTH = 200

# Comments become a blank; string and character literals, and the <name> of an include,
# are kept whole: a "//" inside them starts no comment ("/tmp//pipe.h").
_COMMENT_OR_KEPT = re.compile(
    rb"(?=[#%\"'/])"  # most positions start none of these: a quick way past them
    rb"(?:(?:#|%:)[ \t\f\v]*(?:include_next|include|import)[ \t\f\v]*<[^>\n]*>"
    rb'|"(?:[^"\\\n]|\\.)*"'
    rb"|'(?:[^'\\\n]|\\.)*'"
    rb"|(/\*.*?\*/|//[^\n]*))",
    re.DOTALL,
)
_DIRECTIVE_START = rb"^[ \t\f\v]*(?:#|%:|\?\?=)[ \t\f\v]*"
_DEFINE = re.compile(
    _DIRECTIVE_START + rb"define[ \t\f\v]+([A-Za-z_$][A-Za-z0-9_$]*)(\([^)\n]*\))?([^\n]*)",
    re.MULTILINE,
)
# The operand of an include whose name is not spelled out ("..." or <...>).
_INCLUDE_OPERAND = re.compile(
    _DIRECTIVE_START + rb"(?:include_next|include|import)\b(?![ \t\f\v]*[<\"])([^\n]*)",
    re.MULTILINE,
)
_PROBE_OPERAND = re.compile(rb"__has_include(?:_next)?[ \t\f\v]*\((?![ \t\f\v]*[<\"])[^\n]*")
_CONDITION = re.compile(_DIRECTIVE_START + rb"(?:el)?if\b([^\n]*)", re.MULTILINE)
_PROBES = frozenset({"__has_include", "__has_include_next"})
_DEFINE_LINE = re.compile(_DIRECTIVE_START + rb"define\b", re.MULTILINE)
_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<str>(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*"|(?:u8|[uUL])?'(?:[^'\\\n]|\\.)*')
    | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
    | (?P<num>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.])*)
    | (?P<punct>\#\#|%:%:|\#|%:|\.\.\.|->|<<|>>|<=|>=|==|!=|&&|\|\||::|\+\+|--
                |[-+*/%&|^!=]=?|[][(){}.,;:?~<>])
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_SAME = {"%:": "#", "%:%:": "##"}


class Unresolved(Exception):
    """The scan cannot bound the files an include may name; the message says why."""


def strip_comments(text: bytes) -> bytes:
    """``text`` with each comment made a blank (line splices already joined)."""
    if b"/" not in text:
        return text
    return _COMMENT_OR_KEPT.sub(lambda m: b" " if m.group(1) else m.group(0), text)


class Token(NamedTuple):
    kind: str
    text: str
    #: Whitespace came before it (kept as one space in a ``<name>`` and by ``#``).
    space: bool = False
    #: The macros whose replacement made it: they are not expanded again inside it.
    hidden: frozenset[str] = frozenset()


_PLACEMARKER = Token("placemarker", "")


def tokenize(text: str) -> tuple[Token, ...]:
    tokens: list[Token] = []
    space = False
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        if kind == "space":
            space = True
            continue
        tokens.append(Token(kind, _SAME.get(match.group(), match.group()), space))
        space = False
    return tuple(tokens)


def _spelling(tokens: Sequence[Token]) -> str:
    return "".join((" " if t.space and i else "") + t.text for i, t in enumerate(tokens))


@dataclass(frozen=True)
class Operand:
    """An include, a ``__has_include`` or a call of a macro that holds one, whose file
    name only macro expansion tells."""

    tokens: tuple[Token, ...]
    #: The folder of the text it stands in (where a quoted name is looked for first).
    here: str
    #: A ``__has_include`` (or a call holding one): the names are its operands.
    probe: bool

    @property
    def spelled(self) -> str:
        return _spelling(self.tokens)


@dataclass(frozen=True)
class Macro:
    name: str
    #: None for an object-like macro; a variadic one's last parameter takes the rest.
    params: tuple[str, ...] | None
    variadic: bool
    body: tuple[Token, ...]


def _parameters(spelled: str) -> tuple[tuple[str, ...], bool]:
    names = [p.strip() for p in spelled.strip("()").split(",")] if spelled.strip("() ") else []
    if names and names[-1].endswith("..."):
        return (*names[:-1], names[-1][:-3].strip() or "__VA_ARGS__"), True
    return tuple(names), False


class Macros:
    """Every definition the scanned texts and the caller's defines give each macro, and
    the ``#if`` conditions of those texts (a macro may hide a ``__has_include`` there).

    Definitions are kept as spelled and parsed when an expansion meets the name: a
    header set defines thousands of macros and an include uses a handful."""

    def __init__(self, defines: Mapping[str, str | None]) -> None:
        #: name -> each ``(parameters as spelled, or None; body)`` defined for it.
        self._spelled: dict[str, dict[tuple[bytes | None, bytes], None]] = {}
        self._parsed: dict[str, list[Macro]] = {}
        self._conditions: list[tuple[bytes, str]] = []
        for name, value in defines.items():  # -DNAME means -DNAME=1
            self._add(name, None, b"1" if value is None else value.encode("utf-8"))

    def add_text(self, clean: bytes, here: str) -> None:
        """Take the ``#define`` and ``#if`` lines of a text found in folder ``here``
        (splices joined, comments blanked)."""
        if b"define" in clean:
            for match in _DEFINE.finditer(clean):
                self._add(match.group(1).decode("utf-8", "replace"), *match.group(2, 3))
        if b"if" in clean:
            self._conditions += [(m.group(1), here) for m in _CONDITION.finditer(clean)]

    def _add(self, name: str, params: bytes | None, body: bytes) -> None:
        self._spelled.setdefault(name, {})[(params, body.strip())] = None
        self._parsed.pop(name, None)

    def __contains__(self, name: str) -> bool:
        return name in self._spelled

    def of(self, name: str) -> list[Macro]:
        """Every definition of ``name`` (none when nothing defines it)."""
        if name not in self._parsed:
            self._parsed[name] = [
                _macro(name, params, body) for params, body in self._spelled.get(name, {})
            ]
        return self._parsed[name]

    def _probing(self) -> set[str]:
        """The macros whose expansion may hold a ``__has_include``."""
        found = set(_PROBES)
        grew = True
        while grew:
            grew = False
            words = [word.encode() for word in found]
            for name, spelled in self._spelled.items():
                if name in found or not any(w in body for _, body in spelled for w in words):
                    continue  # (a word inside a longer name is ruled out below)
                if any(t.text in found for macro in self.of(name) for t in macro.body):
                    found.add(name)
                    grew = True
        return found - _PROBES

    def probe_calls(self) -> list[Operand]:
        """Each use, in an ``#if``, of a macro that may expand to a ``__has_include``."""
        probing = self._probing()
        words = [name.encode() for name in probing]
        calls: list[Operand] = []
        for condition, here in self._conditions:
            if not any(word in condition for word in words):
                continue
            tokens = tokenize(condition.decode("utf-8", "replace"))
            calls += [
                Operand(_call(tokens, i), here, probe=True)
                for i, token in enumerate(tokens)
                if token.text in probing
            ]
        return calls


def _macro(name: str, params: bytes | None, body: bytes) -> Macro:
    tokens = _body(body.decode("utf-8", "replace"))
    if params is None:
        return Macro(name, None, False, tokens)
    return Macro(name, *_parameters(params.decode("utf-8", "replace")), tokens)


def _text_of(spelled: bytes | None) -> str:
    return "" if spelled is None else spelled.decode("utf-8", "replace")


def _body(text: str) -> tuple[Token, ...]:
    tokens = tokenize(text)
    return (tokens[0]._replace(space=False), *tokens[1:]) if tokens else ()


def _call(tokens: tuple[Token, ...], start: int) -> tuple[Token, ...]:
    """The name at ``start`` and, when a ``(`` follows, its arguments through ``)``."""
    call = _arguments(tokens, start + 1)
    return tokens[start : call[1] if call else start + 1]


def operands(clean: bytes, here: str) -> list[Operand]:
    """The includes and ``__has_include`` of a text in folder ``here`` (splices joined,
    comments blanked) whose name is not spelled out. A ``__has_include`` in a
    ``#define`` is left out: its operand is the macro's parameter, or known where the
    macro is used (:meth:`Macros.probe_calls`)."""
    found = [
        Operand(tokenize(_text_of(m.group(1))), here, probe=False)
        for m in _INCLUDE_OPERAND.finditer(clean)
    ]
    for match in _PROBE_OPERAND.finditer(clean):
        line_start = clean.rfind(b"\n", 0, match.start()) + 1
        if not _DEFINE_LINE.match(clean, line_start):
            tokens = tokenize(_text_of(match.group(0)))
            found.append(Operand(_call(tokens, 0), here, probe=True))
    return found


def _could_be_predefined(name: str) -> bool:
    """Whether NVRTC may define ``name`` itself (``__CUDA_ARCH__``, ``__FILE__``,
    ``__cplusplus``): a name no text defines is then not known to stay as it is."""
    return (len(name) > 4 and name.startswith("__") and name.endswith("__")) or (
        name.startswith(("__cplusplus", "__STDC"))
    )


def _arguments(tokens: Sequence[Token], start: int) -> tuple[list[tuple[Token, ...]], int] | None:
    """The arguments of an invocation whose ``(`` is at ``start``, and the index past its
    ``)``; None when no ``(`` is there or it is never closed."""
    if start >= len(tokens) or tokens[start].text != "(":
        return None
    args: list[tuple[Token, ...]] = []
    current: list[Token] = []
    depth = 0
    for index in range(start + 1, len(tokens)):
        text = tokens[index].text
        if text == ")" and depth == 0:
            args.append(tuple(current))
            return args, index + 1
        if text == "," and depth == 0:
            args.append(tuple(current))
            current = []
            continue
        depth += (text == "(") - (text == ")")
        current.append(tokens[index])
    return None


def _fit(macro: Macro, args: list[tuple[Token, ...]]) -> list[tuple[Token, ...]] | None:
    """``args`` one for each parameter (a variadic tail joined), or None on a mismatch."""
    params = macro.params or ()
    if not params and args == [()]:
        return []
    if not macro.variadic:
        return args if len(args) == len(params) else None
    fixed = len(params) - 1
    if len(args) < fixed:
        return None
    rest: list[Token] = []
    for arg in args[fixed:]:
        rest += [*([Token("punct", ",")] if rest else []), *arg]
    return [*args[:fixed], tuple(rest)]


def _stringize(arg: Sequence[Token], space: bool) -> Token:
    parts = []
    for index, token in enumerate(arg):
        text = token.text
        if token.kind == "str":
            text = text.replace("\\", "\\\\").replace('"', '\\"')
        parts.append((" " if token.space and index else "") + text)
    return Token("str", '"' + "".join(parts) + '"', space)


def _paste(left: Token, right: Token) -> tuple[Token, ...]:
    if left is _PLACEMARKER or right is _PLACEMARKER:
        return (right if left is _PLACEMARKER else left,)
    joined = tokenize(left.text + right.text)
    return (joined[0]._replace(space=left.space), *joined[1:]) if joined else ()


def _paste_all(tokens: Sequence[Token]) -> list[Token]:
    out: list[Token] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.text == "##" and token.kind == "punct" and out and index + 1 < len(tokens):
            out[-1:] = _paste(out[-1], tokens[index + 1])
            index += 2
            continue
        out.append(token)
        index += 1
    return [t for t in out if t is not _PLACEMARKER]


class _Expander:
    """Every way the preprocessor may expand a token sequence, given :class:`Macros`."""

    def __init__(self, macros: Macros) -> None:
        self._macros = macros
        self._steps = 0

    def expand(self, tokens: tuple[Token, ...], depth: int) -> list[tuple[Token, ...]]:
        self._steps += 1
        if self._steps > MAX_STEPS or depth > MAX_DEPTH:
            raise Unresolved("its macros expand too far for the scan to follow")
        for index, token in enumerate(tokens):
            if token.kind != "id" or token.text in token.hidden:
                continue
            if token.text in self._macros:
                return self._expand_at(tokens, index, depth)
            if _could_be_predefined(token.text):
                raise Unresolved(f"it depends on {token.text}, which no text defines (NVRTC may)")
        return [tokens]

    def _expand_at(
        self, tokens: tuple[Token, ...], index: int, depth: int
    ) -> list[tuple[Token, ...]]:
        token, prefix = tokens[index], tokens[:index]
        # Left as it is: the macro may not be defined where this include stands.
        kept = (token._replace(hidden=token.hidden | {token.text}),)
        results = [prefix + r for r in self.expand(kept + tokens[index + 1 :], depth + 1)]
        for macro in self._macros.of(token.text):
            end, args = index + 1, None
            if macro.params is not None:
                call = _arguments(tokens, index + 1)
                if call is None:
                    continue  # a function-like macro not called: the name as it is
                args, end = _fit(macro, call[0]), call[1]
                if args is None:
                    continue  # NVRTC refuses the call: no file is opened
            for body in self._substitute(macro, args or [], token, depth):
                results += [prefix + r for r in self.expand(body + tokens[end:], depth + 1)]
            _bound(len(results))
        return list(dict.fromkeys(results))

    def _substitute(
        self, macro: Macro, args: list[tuple[Token, ...]], call: Token, depth: int
    ) -> list[tuple[Token, ...]]:
        """Every replacement of ``macro`` called with ``args`` (before rescanning)."""
        params = macro.params or ()
        body = macro.body
        pieces: list[list[tuple[Token, ...]]] = []
        index = 0
        while index < len(body):
            token = body[index]
            following = body[index + 1] if index + 1 < len(body) else None
            if token.text == "__VA_OPT__":
                raise Unresolved("it uses __VA_OPT__, which the scan does not follow")
            if token.text == "#" and params and following and following.text in params:
                pieces.append([(_stringize(args[params.index(following.text)], token.space),)])
                index += 2
                continue
            if token.kind == "id" and token.text in params:
                arg = args[params.index(token.text)]
                pasted = "##" in (following.text if following else "", _text(body, index - 1))
                if pasted:
                    pieces.append([arg or (_PLACEMARKER,)])
                else:
                    pieces.append([_respaced(a, token.space) for a in self.expand(arg, depth + 1)])
            else:
                pieces.append([(token,)])
            index += 1
        _bound(math.prod(len(p) for p in pieces))
        hidden = call.hidden | {macro.name}
        results = []
        for combo in itertools.product(*pieces):
            tokens = _paste_all(list(itertools.chain(*combo)))
            tokens = [t._replace(hidden=t.hidden | hidden) for t in tokens]
            results.append(tuple(_respaced(tuple(tokens), call.space)))
        return results


def _text(tokens: Sequence[Token], index: int) -> str:
    return tokens[index].text if 0 <= index < len(tokens) else ""


def _respaced(tokens: tuple[Token, ...], space: bool) -> tuple[Token, ...]:
    return (tokens[0]._replace(space=space), *tokens[1:]) if tokens else tokens


def _bound(count: int) -> None:
    if count > MAX_ALTERNATIVES:
        raise Unresolved(f"its macros give it more than {MAX_ALTERNATIVES} possible names")


def _name(tokens: tuple[Token, ...]) -> list[tuple[bool, str]]:
    """The ``(quoted, name)`` an expanded operand names: a string literal, or what lies
    between ``<`` and ``>``; nothing when it is neither (NVRTC then opens no file)."""
    if tokens and tokens[0].kind == "str" and tokens[0].text.startswith('"'):
        return [(True, tokens[0].text[1:-1])]
    closing = next((i for i, t in enumerate(tokens) if t.text == ">"), None)
    if not tokens or tokens[0].text != "<" or closing is None:
        return []
    inner = tokens[1:closing]
    name = "".join((" " if t.space else "") + t.text for t in inner)
    return [(False, n) for n in dict.fromkeys((name, name.strip())) if n]


def _probed(tokens: tuple[Token, ...]) -> list[tuple[Token, ...]]:
    """The operand of each ``__has_include(...)`` in an expanded sequence."""
    found = []
    for index, token in enumerate(tokens):
        call = _arguments(tokens, index + 1) if token.text in _PROBES else None
        if call is not None:
            found.append(tuple(itertools.chain(*call[0])))
    return found


def include_names(operand: Operand, macros: Macros) -> list[tuple[bool, str]]:
    """Every ``(quoted, name)`` ``operand`` may open; raises :class:`Unresolved` when
    that cannot be bounded."""
    found: dict[tuple[bool, str], None] = {}
    for expanded in _Expander(macros).expand(operand.tokens, 0):
        for named in _probed(expanded) if operand.probe else [expanded]:
            found.update(dict.fromkeys(_name(named)))
    return list(found)
