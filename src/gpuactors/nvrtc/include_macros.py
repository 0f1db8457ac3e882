"""Working out which files an include names through a macro (``#include HEADER``).

NVRTC blocks for good on opening a FIFO, so the include scan (``headers.py``) must see
every file an include can open, those whose name a macro builds too: ``#define HEADER
"pipe.h"`` then ``#include HEADER``, a function-like macro that stringizes or pastes
the name, ``__has_include(HEADER)``. This module expands such an operand the way the
preprocessor does (object-like and function-like macros, ``#``, ``##``, variadic
arguments, rescanning), with the macros of every text the scan read, the caller's
``-D`` defines and the few plain names NVRTC defines itself (``NULL``).

The scan does not evaluate ``#if``, so a name may have several definitions, or none
where the include stands: every definition is tried, and so is the name left as it is.
The result is every name the include could open, a superset of NVRTC's choice. Where
the scan cannot bound that set (a name the compiler itself may define, like
``__CUDA_ARCH__``, inside the name; more alternatives than :data:`MAX_ALTERNATIVES`;
more work than :data:`MAX_EXPANSION_WORK`), :class:`Unresolved` says why: opening an
unchecked name could hang the compile.

The scan runs before NVRTC, holding the GIL: every pattern here is linear in its text
(an unclosed comment, string or name runs to its end instead of being retried at each
start), and the expansions of one scan share one budget of tokens touched.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: The most names one include may resolve to (each definition of each macro doubles them).
MAX_ALTERNATIVES = 256
#: The most tokens the expansions of one scan may scan, copy or compare: a bound on the
#: scan's time (a fraction of a second) whatever the shape of the macros. Following the
#: macro-built includes of CUB or Thrust takes some 30,000.
MAX_EXPANSION_WORK = 500_000
#: The deepest nesting of macro replacements and arguments one operand may take.
MAX_DEPTH = 200
#: The longest line holding an operand, and the longest macro body, the scan tokenizes
#: (the longest in CCCL: some 360 and 12,000 bytes).
MAX_OPERAND_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024

#: Plain names NVRTC defines itself (its builtin header, included before any text), with
#: their values: ``#include STR(NULL)`` opens "0".
NVRTC_DEFINES: Mapping[str, str] = {"NULL": "0"}
# Other plain names NVRTC's builtin header defines, whose values depend on its version
# (CUDART_VERSION) or are never a file name; one inside a name makes the name unknown.
_NVRTC_NAME_PREFIXES = ("__cplusplus", "__STDC", "NV_", "CUDART_", "CUDA_IPC_", "CU_UUID_")
_NVRTC_NAMES = frozenset({"assert", "va_arg", "va_copy", "va_end", "va_start", "NOMINMAX"})

_WORD = rb"A-Za-z0-9_$"
# A raw string's opening quote: after R, LR, uR, UR or u8R that is not the end of a longer
# name (nested lookbehinds, since a lookbehind has a fixed width).
_RAW_QUOTE = (
    rb"(?:(?<=(?<![" + _WORD + rb"])R)|(?<=(?<![" + _WORD + rb"])[uUL]R)"
    rb"|(?<=(?<![" + _WORD + rb"])u8R))\""
)
# Comments become a blank; string and character literals, and the <name> of an include
# or __has_include, are kept whole: a "//" inside them starts no comment ("/tmp//pipe.h").
# Anything left open (a comment, a raw string) runs to the end of the text, a literal or
# a <name> to the end of its line: retried at each later start, each would cost the rest
# of the text again (120 KB of "/* " took 30 s).
_LEXED = re.compile(
    rb"(?=[#%_\"'/.0-9])"  # most positions start none of these: a quick way past them
    rb"(?:(?:#|%:)[ \t\f\v]*(?:include_next|include|import)[ \t\f\v]*<[^>\n]*>?"
    rb"|(?<![" + _WORD + rb"])__has_include(?:_next)?[ \t\f\v]*\([ \t\f\v]*<[^>\n]*>?"
    rb"|" + _RAW_QUOTE + rb"(?P<delimiter>[^()\\ \t\f\v\n]{0,16})\((?:.*?\)(?P=delimiter)\"|.*)"
    rb'|"(?:[^"\\\n]|\\[^\n])*"?'
    # a number with a digit separator (1'000): its quote opens no character literal
    rb"|(?<![" + _WORD + rb".])\.?[0-9](?:[eEpP][+-]|[" + _WORD + rb".])*'[" + _WORD + rb"]"
    rb"(?:[eEpP][+-]|'[" + _WORD + rb"]|[" + _WORD + rb".])*"
    rb"|'(?:[^'\\\n]|\\[^\n])*'?"
    rb"|(?P<comment>/\*(?:.*?\*/|.*)|//[^\n]*))",
    re.DOTALL,
)
# After a comment that spans lines, a directive starts a line of its own.
_DIRECTIVE_AHEAD = re.compile(rb"[ \t\f\v]*(?:#|%:|\?\?=)")
_DIRECTIVE_START = rb"^[ \t\f\v]*(?:#|%:|\?\?=)[ \t\f\v]*"
_DEFINE = re.compile(
    _DIRECTIVE_START + rb"define[ \t\f\v]+([A-Za-z_$][A-Za-z0-9_$]*)(\([^)\n]*\))?([^\n]*)",
    re.MULTILINE,
)
# The operand of an include whose name is not spelled out ("..." or <...>).
_INCLUDE_OPERAND = re.compile(
    _DIRECTIVE_START + rb"(include_next|include|import)\b(?![ \t\f\v]*[<\"])([^\n]*)",
    re.MULTILINE,
)
_CONDITION = re.compile(_DIRECTIVE_START + rb"(?:el)?if\b([^\n]*)", re.MULTILINE)
_PROBES = frozenset({"__has_include", "__has_include_next"})
# "__has_include" or "__has_include_next" not inside a longer name. The literal comes
# first and the check behind it after, so that a search skips to each occurrence at once.
_PROBE_NAME = (
    rb"__has_include(_next)?"
    rb"(?<![" + _WORD + rb"]__has_include)(?<![" + _WORD + rb"]__has_include_next)"
    rb"(?![" + _WORD + rb"])"
)
_PROBE_WORD = re.compile(_PROBE_NAME)
# A __has_include whose operand is spelled out, as "..." (a '>' kept) or <...> (a '"'
# kept); the closing group may be empty (an unclosed name runs to the end of its line:
# the next probe is never retried from inside it).
_SPELLED_PROBE = re.compile(
    _PROBE_NAME + rb'[ \t\f\v]*\([ \t\f\v]*(?:"([^"\r\n]*)("?)|<([^>\r\n]*)(>?))'
)
# Words before a __has_include that ask whether it is defined, or define it: no probe.
_NOT_A_PROBE = re.compile(
    rb"(?<![" + _WORD + rb"])(?:defined[ \t\f\v]*\(?|define|undef|(?:el)?ifn?def)[ \t\f\v]*\Z"
)
_DEFINE_LINE = re.compile(_DIRECTIVE_START + rb"define\b")
_IDENTIFIER = re.compile(rb"[A-Za-z_$][A-Za-z0-9_$]*")
# (An unclosed literal runs to the end of its line, as in _LEXED.)
_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<str>(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*"?|(?:u8|[uUL])?'(?:[^'\\\n]|\\.)*'?)
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


class Name(NamedTuple):
    """A file name an include or ``__has_include`` may open."""

    quoted: bool
    name: str
    #: ``#include_next`` or ``__has_include_next``: the search resumes after the folder
    #: its includer was found in, which the scan does not track.
    resumes: bool = False


def comment_free_readings(text: bytes) -> list[bytes]:
    """``text`` with each comment made a blank (line splices already joined); and, when a
    directive follows a comment that spans lines (``x; /* ... */ #include``), a second
    reading where that comment ends a line: NVRTC takes such a directive, yet the same
    comment inside a directive (a ``#define`` body) does not end it."""
    if b"/" not in text:
        return [text]
    flat, directive_after_comment = _blank_comments(text, end_lines=False)
    if not directive_after_comment:
        return [flat]
    return [flat, _blank_comments(text, end_lines=True)[0]]


def _blank_comments(text: bytes, *, end_lines: bool) -> tuple[bytes, bool]:
    """``text`` with each comment a blank (a line end, with ``end_lines``, where a
    directive follows a comment that spans lines), and whether such a comment is there."""
    directive_after_comment = False

    def blank(match: re.Match[bytes]) -> bytes:
        nonlocal directive_after_comment
        comment = match.group("comment")
        if comment is None:
            return match.group(0)  # a literal or a <name>, kept whole
        if b"\n" in comment and _DIRECTIVE_AHEAD.match(text, match.end()):
            directive_after_comment = True
            return b"\n" if end_lines else b" "
        return b" "

    return _LEXED.sub(blank, text), directive_after_comment


def spelled_probes(clean: bytes) -> Iterator[tuple[int, Name]]:
    """Where each ``__has_include`` whose name is spelled out stands, and that name."""
    if b"__has_include" not in clean:
        return
    for match in _SPELLED_PROBE.finditer(clean):
        quoted = match.group(2) is not None
        name, closed = match.group(2, 3) if quoted else match.group(4, 5)
        if closed:
            for form in name_forms(name.decode("utf-8", "replace")):
                yield match.start(), Name(quoted, form, bool(match.group(1)))


def name_forms(name: str) -> list[str]:
    """A spelled name as NVRTC may take it: as written and without its outer blanks."""
    return [n for n in dict.fromkeys((name, name.strip())) if n]


def unspelled_includes(clean: bytes) -> bool:
    """Whether a cleaned text has an include whose name is not spelled out ("..." or
    <...>): a macro gives it, so NVRTC may read through it a file the scan did not."""
    return (b"include" in clean or b"import" in clean) and (
        _INCLUDE_OPERAND.search(clean) is not None
    )


def unspelled_probes(clean: bytes) -> Iterator[int]:
    """Where each ``__has_include`` stands whose name the scan cannot read (a macro gives
    it, an empty macro stands before its ``(``, it is passed to a macro): NVRTC reports
    no read of a file that is absent, so no key can cover whether one appears there.
    ``defined(__has_include)``, ``#ifdef __has_include`` and ``#define __has_include``
    are no probes."""
    if b"__has_include" not in clean:
        return
    spelled = {start for start, _name in spelled_probes(clean)}
    for match in _PROBE_WORD.finditer(clean):
        start = match.start()
        if start not in spelled and not _NOT_A_PROBE.search(clean, max(0, start - 48), start):
            yield start


class Token(NamedTuple):
    #: "id", "str", "num", "punct", "other"; "unknown" for a token made from a name NVRTC
    #: may define (its spelling is not what NVRTC sees).
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
    #: An ``#include_next`` (see :attr:`Name.resumes`).
    resumes: bool = False

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


class Budget:
    """The expansion work one scan may still do, in tokens scanned, copied or compared."""

    def __init__(self, tokens: int = MAX_EXPANSION_WORK) -> None:
        self.left = tokens

    def spend(self, tokens: int) -> None:
        self.left -= tokens
        if self.left < 0:
            raise Unresolved("its macros are too complex for the scan to follow")


class Macros:
    """Every definition the scanned texts, the caller's defines and NVRTC give each
    macro, and the ``#if`` conditions of those texts (a macro may hide a
    ``__has_include`` there).

    Definitions are kept as spelled and parsed when an expansion meets the name: a
    header set defines thousands of macros and an include uses a handful. The
    expansions of one scan share its :attr:`budget`."""

    def __init__(self, defines: Mapping[str, str | None]) -> None:
        #: The work left to the expansions of this scan.
        self.budget = Budget()
        #: name -> each ``(parameters as spelled, or None; body)`` defined for it.
        self._spelled: dict[str, dict[tuple[bytes | None, bytes], None]] = {}
        self._parsed: dict[str, list[Macro]] = {}
        #: Each ``#if`` condition and the folder of its text (once: texts repeat them).
        self._conditions: dict[tuple[bytes, str], None] = {}
        #: word -> the macros whose bodies hold it: who may lead to a ``__has_include``.
        self._used_by: dict[bytes, set[bytes]] = {}
        for name, known in NVRTC_DEFINES.items():
            self._add(name, None, known.encode("utf-8"))
        for name, value in defines.items():  # -DNAME means -DNAME=1
            self._add(name, None, b"1" if value is None else value.encode("utf-8"))

    def add_text(self, clean: bytes, here: str) -> None:
        """Take the ``#define`` and ``#if`` lines of a text found in folder ``here``
        (splices joined, comments blanked)."""
        if b"define" in clean:
            for match in _DEFINE.finditer(clean):
                self._add(match.group(1).decode("utf-8", "replace"), *match.group(2, 3))
        if b"if" in clean:
            self._conditions.update(((m.group(1), here), None) for m in _CONDITION.finditer(clean))

    def _add(self, name: str, params: bytes | None, body: bytes) -> None:
        self._spelled.setdefault(name, {})[(params, body.strip())] = None
        self._parsed.pop(name, None)
        for word in _IDENTIFIER.findall(body):
            self._used_by.setdefault(word, set()).add(name.encode("utf-8"))

    def __contains__(self, name: str) -> bool:
        return name in self._spelled

    def of(self, name: str) -> list[Macro]:
        """Every definition of ``name`` (none when nothing defines it)."""
        if name not in self._parsed:
            self._parsed[name] = [
                _macro(name, params, body) for params, body in self._spelled.get(name, {})
            ]
            self.budget.spend(sum(len(m.body) for m in self._parsed[name]) * _TOKENIZE_COST)
        return self._parsed[name]

    def uncertain(self, token: Token) -> bool:
        """Whether NVRTC may see something else where ``token`` stands: a name NVRTC may
        define that no text defines, or a token made from one."""
        if token.kind == "unknown":
            return True
        return token.kind == "id" and token.text not in self and _could_be_predefined(token.text)

    def _probing(self) -> set[bytes]:
        """The macros whose expansion may hold a ``__has_include``: one walk back from
        it over the words each body uses."""
        found: set[bytes] = set()
        frontier = [word.encode() for word in _PROBES]
        while frontier:
            for user in self._used_by.get(frontier.pop(), ()):
                if user not in found:
                    found.add(user)
                    frontier.append(user)
        return found - {word.encode() for word in _PROBES}

    def probe_calls(self) -> list[Operand]:
        """Each use, in an ``#if``, of a macro that may expand to a ``__has_include``."""
        probing = self._probing()
        if not probing:
            return []
        names = {word.decode("utf-8") for word in probing}
        calls: dict[Operand, None] = {}
        for condition, here in self._conditions:
            if probing.isdisjoint(_IDENTIFIER.findall(condition)):
                continue
            tokens = _line_tokens(condition, self.budget)
            calls.update((Operand(use, here, probe=True), None) for use in _uses(tokens, names))
        return list(calls)


def _macro(name: str, params: bytes | None, body: bytes) -> Macro:
    if len(body) > MAX_BODY_BYTES:
        raise Unresolved(f"{name} is defined as {len(body)} bytes, too long to follow")
    tokens = _body(body.decode("utf-8", "replace"))
    if params is None:
        return Macro(name, None, False, tokens)
    return Macro(name, *_parameters(params.decode("utf-8", "replace")), tokens)


def _line_tokens(line: bytes, budget: Budget) -> tuple[Token, ...]:
    """The tokens of a line holding an operand; raises :class:`Unresolved` when it is too
    long to tokenize in a moment."""
    if len(line) > MAX_OPERAND_BYTES:
        raise Unresolved(f"its line is {len(line)} bytes, too long to follow")
    tokens = tokenize(line.decode("utf-8", "replace"))
    budget.spend(len(tokens) * _TOKENIZE_COST)
    return tokens


def _body(text: str) -> tuple[Token, ...]:
    tokens = tokenize(text)
    return (tokens[0]._replace(space=False), *tokens[1:]) if tokens else ()


def _asks_defined(tokens: Sequence[Token], index: int) -> bool:
    """Whether the name at ``index`` is the operand of ``defined`` (no use of it)."""
    before = [t.text for t in tokens[max(0, index - 2) : index]]
    return before[-1:] == ["defined"] or before == ["defined", "("]


def _uses(tokens: tuple[Token, ...], names: Collection[str]) -> list[tuple[Token, ...]]:
    """Each use of one of ``names`` in a line: the call through its ``)``. A use not
    followed by ``(`` (an empty macro before it, passed to another macro) or never
    closed makes the whole line one operand, expanded as a whole. Linear: the search
    goes on after each call, and stops at the first that is not closed."""
    found: list[tuple[Token, ...]] = []
    index = 0
    while index < len(tokens):
        if tokens[index].text not in names or _asks_defined(tokens, index):
            index += 1
            continue
        call = _arguments(tokens, index + 1)
        if call is None:
            return [tokens]
        found.append(tokens[index : call[1]])
        index = call[1]
    return found


def operands(clean: bytes, here: str, budget: Budget) -> list[Operand]:
    """The includes and ``__has_include`` of a text in folder ``here`` (splices joined,
    comments blanked) whose name is not spelled out. A ``__has_include`` in a
    ``#define`` is left out: its operand is the macro's parameter, or known where the
    macro is used (:meth:`Macros.probe_calls`). Raises :class:`Unresolved` for a line
    too long to follow, or more of them than ``budget`` allows."""
    spelled = dict.fromkeys(m.group(1, 2) for m in _INCLUDE_OPERAND.finditer(clean))
    found = [
        Operand(_line_tokens(text, budget), here, False, word == b"include_next")
        for word, text in spelled
    ]
    for line in _lines_with_unspelled_probes(clean):
        found += [Operand(use, here, True) for use in _uses(_line_tokens(line, budget), _PROBES)]
    return list(dict.fromkeys(found))


def _lines_with_unspelled_probes(clean: bytes) -> Iterator[bytes]:
    """Each line, but a ``#define``, holding a ``__has_include`` whose name the scan
    cannot read; once, however many it holds."""
    line_end = 0
    for start in unspelled_probes(clean):
        if start < line_end:
            continue  # that line is taken already
        line_start = clean.rfind(b"\n", 0, start) + 1
        line_end = clean.find(b"\n", start)
        line_end = len(clean) if line_end < 0 else line_end
        if not _DEFINE_LINE.match(clean, line_start):
            yield clean[line_start:line_end]


def _could_be_predefined(name: str) -> bool:
    """Whether NVRTC may define ``name`` itself (``__CUDA_ARCH__``, ``__FILE__``,
    ``__cplusplus``, ``CUDART_VERSION``): a name no text defines is then not known to
    stay as it is."""
    return (
        (len(name) > 4 and name.startswith("__") and name.endswith("__"))
        or name.startswith(_NVRTC_NAME_PREFIXES)
        or name in _NVRTC_NAMES
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
    # A token NVRTC spells otherwise makes the string one the scan cannot know.
    kind = "unknown" if any(t.kind == "unknown" for t in arg) else "str"
    return Token(kind, '"' + "".join(parts) + '"', space)


def _paste(left: Token, right: Token) -> tuple[Token, ...]:
    if left is _PLACEMARKER or right is _PLACEMARKER:
        return (right if left is _PLACEMARKER else left,)
    joined = tokenize(left.text + right.text)
    if "unknown" in (left.kind, right.kind):
        joined = tuple(t._replace(kind="unknown") for t in joined)
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


# What a step of an expansion costs beyond the tokens it touches, and what making a
# token from text costs, in tokens touched.
_STEP_COST = 8
_TOKENIZE_COST = 4


class _Expander:
    """Every way the preprocessor may expand a token sequence, given :class:`Macros`;
    its work is charged to their :class:`Budget`."""

    def __init__(self, macros: Macros) -> None:
        self._macros = macros
        self._budget = macros.budget

    def expand(self, tokens: tuple[Token, ...], depth: int = 0) -> list[tuple[Token, ...]]:
        """Each macro met is tried as each of its definitions and left as it is (it may
        be undefined there). A work list of ``(tokens, where to go on)``, each resumed
        past what is done: no step rescans the part before it."""
        if depth > MAX_DEPTH:
            raise Unresolved("its macros nest too deep for the scan to follow")
        results: dict[tuple[Token, ...], None] = {}
        todo = [(tokens, 0)]
        while todo:
            current, start = todo.pop()
            self._budget.spend(_STEP_COST)
            index = self._next_macro(current, start)
            if index is None:
                self._budget.spend(len(current))  # (hashed as a key)
                results[current] = None
                _bound(len(results))
                continue
            # (pushed last first: the alternatives come out in the order they are defined)
            replaced = list(self._replacements(current, index, depth))
            todo += [(r, index) for r in reversed(replaced)]
            todo.append((current, index + 1))
        return list(results)

    def _next_macro(self, tokens: tuple[Token, ...], start: int) -> int | None:
        """Where the first macro from ``start`` on stands that may be replaced."""
        for index in range(start, len(tokens)):
            token = tokens[index]
            if token.kind == "id" and token.text not in token.hidden and token.text in self._macros:
                self._budget.spend(index - start + 1)
                return index
        self._budget.spend(len(tokens) - start)
        return None

    def _replacements(
        self, tokens: tuple[Token, ...], index: int, depth: int
    ) -> Iterator[tuple[Token, ...]]:
        """``tokens`` with the macro at ``index`` replaced, once per definition."""
        token = tokens[index]
        for macro in self._macros.of(token.text):
            end, args = index + 1, None
            if macro.params is not None:
                call = _arguments(tokens, index + 1)
                self._budget.spend((call[1] if call else len(tokens)) - index)
                if call is None:
                    continue  # a function-like macro not called: the name as it is
                args, end = _fit(macro, call[0]), call[1]
                if args is None:
                    continue  # NVRTC refuses the call: no file is opened
            for body in self._substitute(macro, args or [], token, depth):
                self._budget.spend(len(tokens) + len(body))
                yield tokens[:index] + body + tokens[end:]

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
                    expanded = self.expand(arg, depth + 1)
                    pieces.append([_respaced(self._marked(a), token.space) for a in expanded])
            else:
                pieces.append([(token,)])
            index += 1
        _bound(math.prod(len(p) for p in pieces))
        hidden = call.hidden | {macro.name}
        if len(hidden) > MAX_DEPTH:  # each replacement inside another one adds one
            raise Unresolved("its macros nest too deep for the scan to follow")
        results = []
        for combo in itertools.product(*pieces):
            tokens = _paste_all(list(itertools.chain(*combo)))
            self._budget.spend(len(tokens) * len(hidden))
            tokens = [t._replace(hidden=t.hidden | hidden) for t in tokens]
            results.append(tuple(_respaced(tuple(tokens), call.space)))
        return results

    def _marked(self, expanded: tuple[Token, ...]) -> tuple[Token, ...]:
        """An expanded argument with each name NVRTC may define marked: NVRTC replaced
        it already, so what a ``#`` or ``##`` later makes of it is unknown."""
        if not any(self._macros.uncertain(t) for t in expanded):
            return expanded
        return tuple(
            t._replace(kind="unknown") if self._macros.uncertain(t) else t for t in expanded
        )


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
    first = tokens[0].text if tokens else ""
    if tokens and tokens[0].kind == "str" and first.startswith('"'):
        return [(True, first[1:-1])] if len(first) > 1 and first.endswith('"') else []
    closing = next((i for i, t in enumerate(tokens) if t.text == ">"), None)
    if not tokens or tokens[0].text != "<" or closing is None:
        return []
    inner = tokens[1:closing]
    name = "".join((" " if t.space else "") + t.text for t in inner)
    return [(False, n) for n in dict.fromkeys((name, name.strip())) if n]


def _probed(tokens: tuple[Token, ...], macros: Macros) -> Iterator[tuple[bool, tuple[Token, ...]]]:
    """Whether each ``__has_include(...)`` of an expanded sequence is a ``_next`` one, and
    its operand. One not followed by ``(`` NVRTC rejects (unless what follows is a name
    NVRTC may define); one never closed ends the search (NVRTC stops there too)."""
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.text not in _PROBES or _asks_defined(tokens, index):
            index += 1
            continue
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following is not None and macros.uncertain(following):
            raise Unresolved(f"{following.text} follows __has_include (NVRTC may define it)")
        call = _arguments(tokens, index + 1)
        if call is None and following is not None and following.text == "(":
            return
        if call is not None:
            yield token.text == "__has_include_next", tuple(itertools.chain(*call[0]))
            index = call[1]
        else:
            index += 1


def _known(tokens: tuple[Token, ...], macros: Macros) -> tuple[Token, ...]:
    """``tokens``, which give a file name, once it is sure NVRTC sees them the same."""
    for token in tokens:
        if macros.uncertain(token):
            raise Unresolved(f"it depends on {token.text}, which no text defines (NVRTC may)")
    return tokens


def names_of(operand: Operand, macros: Macros) -> list[Name]:
    """Every name ``operand`` may open; raises :class:`Unresolved` when that cannot be
    bounded. In a probe only the operands of its ``__has_include`` must be known: the
    rest of an ``#if`` (``__cplusplus >= 201703L &&``) names no file."""
    found: dict[Name, None] = {}
    for expanded in _Expander(macros).expand(operand.tokens):
        if operand.probe:
            for resumes, named in _probed(expanded, macros):
                found.update((Name(*n, resumes), None) for n in _name(_known(named, macros)))
        else:
            for quoted, name in _name(_known(expanded, macros)):
                found[Name(quoted, name, operand.resumes)] = None
    return list(found)


def include_names(operand: Operand, macros: Macros) -> list[tuple[bool, str]]:
    """Every ``(quoted, name)`` ``operand`` may open (see :func:`names_of`)."""
    return [(n.quoted, n.name) for n in names_of(operand, macros)]
