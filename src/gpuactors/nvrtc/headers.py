"""Reading the files a compile names, without ever blocking or reading without end.

NVRTC opens whatever an ``#include`` names: ``/dev/zero`` it refuses, but a FIFO
blocks it (and its thread) for good, ``__has_include`` included. So before NVRTC runs,
:func:`scan_includes` follows every include it can spot, through the macros that give
names too (``include_macros.py``), and refuses, with
:class:`~gpuactors.errors.InvalidArgument`, a name that leads to something other than
a regular file or a folder, or to a file over :data:`MAX_HEADER_BYTES`. The scan is a
guard and a first reading of the headers, never the cache key's authority: what NVRTC
really read comes from NVRTC itself (see ``manifest.py``). It reads the files it finds
so that the key can later check they did not change while NVRTC compiled.

Every read here opens with ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for
a writer), checks the open file's type and size with ``fstat``, and reads at most the cap.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgument
from .include_macros import Macros, Operand, Unresolved, include_names, operands, strip_comments

#: The largest header a compile may read (NVRTC would take more; nothing sane needs it).
MAX_HEADER_BYTES = 64 * 1024 * 1024
#: The most bytes the scan reads over all the files it follows.
MAX_SCAN_BYTES = 512 * 1024 * 1024

ABSENT = b"absent"
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

# Translation phases 1 to 3 before matching directives: line splices go (a ``??/``
# trigraph is a backslash too), comments become blanks (``include_macros.strip_comments``
# keeps string literals and <names> whole).
_SPLICE = re.compile(rb"(?:\\|\?\?/)[ \t]*\r?\n")
_NAME = rb'[ \t\f\v]*([<"])([^>"\r\n]+)[>"]'
_DIRECTIVE = re.compile(
    rb"^[ \t\f\v]*(?:#|%:|\?\?=)[ \t\f\v]*(?:include_next|include|import)" + _NAME,
    re.MULTILINE,
)
# The preprocessor opens a file only for a directive or operator spelled with one of
# these words (a macro cannot expand to a directive); a universal character name could
# spell them otherwise. A text without any reads no file.
_FILE_WORDS = (b"include", b"import", b"embed", b"\\u", b"\\U")
_HAS_INCLUDE = re.compile(rb"__has_include(?:_next)?[ \t\f\v]*\(" + _NAME)
# A __has_include whose name is not spelled out (a macro names it): the scan cannot say
# which paths it looks at, and NVRTC reports no read for a file that is absent.
_UNSEEN_PROBE = re.compile(rb"__has_include(?:_next)?[ \t\f\v]*\((?![ \t\f\v]*[<\"])")
# An include whose name a macro gives: the scan does not follow it, so NVRTC may read
# files it never saw (``\b``: ``include_next`` is not ``include`` followed by ``_next``).
_MACRO_INCLUDE = re.compile(
    rb"^[ \t\f\v]*(?:#|%:|\?\?=)[ \t\f\v]*(?:include_next|include|import)\b(?![ \t\f\v]*[<\"])",
    re.MULTILINE,
)
# The macros whose value is the moment of the compile: a module that uses one differs
# from every earlier compile of the same text, so no key can name it (as ccache does).
_TIME_MACROS = re.compile(rb"(?<![A-Za-z0-9_$])__(?:DATE|TIME|TIMESTAMP)__(?![A-Za-z0-9_$])")


@dataclass(frozen=True)
class Unreadable:
    """Why a path that exists was not read, and whether NVRTC would hang on it or read
    it without end (a FIFO, a device, a socket, a huge file) rather than just fail."""

    reason: str
    hazard: bool = True


def _describe(mode: int) -> str:
    kinds = {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFSOCK: "a socket",
        stat.S_IFDIR: "a folder",
    }
    return kinds.get(stat.S_IFMT(mode), "not a regular file")


def read_regular(path: str, *, limit: int | None = None) -> bytes | Unreadable | None:
    """The bytes of the regular file at ``path``; None when nothing is there; else why
    it was not read (not a regular file, over ``limit`` (default :data:`MAX_HEADER_BYTES`),
    an I/O error).

    Never blocks on a FIFO and never reads more than ``limit`` bytes.
    """
    if limit is None:
        limit = MAX_HEADER_BYTES
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return Unreadable(f"cannot be opened ({exc.strerror})", hazard=False)
    except ValueError as exc:  # a NUL or a lone surrogate: no such path
        return Unreadable(f"is not a path ({exc})", hazard=False)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Unreadable(f"is {_describe(info.st_mode)}", not stat.S_ISDIR(info.st_mode))
        if info.st_size > limit:
            return Unreadable(f"is {info.st_size} bytes, over the {limit}-byte limit")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            return Unreadable(f"grew over the {limit}-byte limit while it was read")
        return b"".join(chunks)
    except OSError as exc:
        return Unreadable(f"cannot be read ({exc.strerror})", hazard=False)
    finally:
        os.close(fd)


def file_state(path: str) -> bytes:
    """What the cache key records of a file NVRTC read: its SHA-256, ``absent``, or why
    it cannot be read (then the key differs from any compile that could read it)."""
    content = read_regular(path)
    if content is None:
        return ABSENT
    if isinstance(content, Unreadable):
        return b"unreadable: " + content.reason.encode("utf-8", "replace")
    return b"sha256:" + hashlib.sha256(content).digest()


def presence(path: str) -> bytes:
    """What the key records of a path NVRTC may have probed: absent, a file, or another kind."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return ABSENT
    return b"file" if stat.S_ISREG(info.st_mode) else b"other"


@dataclass(frozen=True)
class IncludeScan:
    """What :func:`scan_includes` saw: the state of each file it read, by the path NVRTC
    would name it with, and every candidate path it looked at."""

    files: dict[str, bytes]
    probed: tuple[str, ...]
    #: True when the source and the in-memory headers cannot make NVRTC open any file.
    reads_no_file: bool
    #: True when a text probes for a file whose name the scan cannot read (a
    #: ``__has_include`` of a macro): no key can cover whether that file exists.
    unseen_probes: bool = False
    #: True when a text uses ``__DATE__``, ``__TIME__`` or ``__TIMESTAMP__``: its module
    #: holds the moment it was compiled.
    time_macros: bool = False
    #: True when a text includes a name a macro gives (``#include MACRO``): NVRTC may
    #: then read files the scan did not follow.
    macro_includes: bool = False


def _unspliced(text: bytes) -> bytes:
    return _SPLICE.sub(b"", text) if b"\\" in text or b"??/" in text else text


def reads_no_file(texts: Sequence[bytes]) -> bool:
    """Whether these texts, compiled together, can make NVRTC open no file at all."""
    return not any(word in _unspliced(text) for text in texts for word in _FILE_WORDS)


_PLAIN_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\r\n]+)"[ \t]*$', re.MULTILINE)


def includes_only_given(texts: Sequence[str], given: Collection[str]) -> bool:
    """Whether these texts can make NVRTC open no file once each plain ``#include "name"``
    of a header in ``given`` is set aside: NVRTC takes an in-memory header before any
    file of that name. For an NVRTC that cannot report its reads (NVRTC 12), so that
    sources built from in-memory headers alone (the engine's) keep a cacheable key.
    Conservative: any other word that could open a file, in a comment too, says no."""
    for text in texts:
        rest = _PLAIN_INCLUDE.sub(
            lambda m: b"" if m.group(1).decode("utf-8", "replace") in given else m.group(0),
            _unspliced(text.encode("utf-8")),
        )
        if not reads_no_file([rest]):
            return False
    return True


# Words in every match of the patterns the scan looks for: a text without them is
# passed over without removing its comments.
_SCANNED_WORDS = (b"include", b"import", b"__DATE__", b"__TIME")


def _cleaned(text: bytes) -> bytes:
    """``text`` as the directives are matched in: splices joined, comments blanked."""
    return strip_comments(_unspliced(text))


def _names(clean: bytes) -> list[tuple[bool, str]]:
    """``(quoted, name)`` of every include and ``__has_include`` spotted in a cleaned text."""
    if b"include" not in clean and b"import" not in clean:  # the usual case, cheaply
        return []
    found = [*_DIRECTIVE.finditer(clean), *_HAS_INCLUDE.finditer(clean)]
    return [(m.group(1) == b'"', m.group(2).decode("utf-8", "replace").strip()) for m in found]


def _in_code(pattern: re.Pattern[bytes], clean: bytes, *words: bytes) -> bool:
    """Whether ``pattern`` matches a cleaned text; ``words``: one of them is in any match
    (so most texts are passed over cheaply)."""
    return any(word in clean for word in words) and pattern.search(clean) is not None


def _untracked_in(clean: bytes) -> tuple[bool, bool]:
    return (
        _in_code(_UNSEEN_PROBE, clean, b"__has_include"),
        _in_code(_TIME_MACROS, clean, b"__DATE__", b"__TIME"),
    )


def holds_untracked_input(text: bytes) -> tuple[bool, bool]:
    """``(unseen_probes, time_macros)`` of one text NVRTC reads (see :class:`IncludeScan`)."""
    return _untracked_in(_cleaned(text))


def unscanned_untracked_input(paths: Sequence[str]) -> bool:
    """Whether one of the files at ``paths`` (read by NVRTC, not by the scan: an
    ``#include MACRO`` led there) probes for a file it names by a macro or uses a time
    macro: its module is then one no key can name, as for a text the scan read."""
    for path in paths:
        content = read_regular(path)
        if isinstance(content, bytes) and any(holds_untracked_input(content)):
            return True
    return False


class _Scanner:
    """One run of :func:`scan_includes`: the texts still to read, what was found so far."""

    def __init__(
        self,
        headers: Mapping[str, str],
        include_paths: Sequence[str],
        defines: Mapping[str, str | None],
        name: str,
    ) -> None:
        self.headers = headers
        self.include_paths = list(include_paths)
        self.name = name
        self.files: dict[str, bytes] = {}
        self.probed: list[str] = []
        self.pending: list[tuple[bytes, str]] = []
        self.budget = MAX_SCAN_BYTES
        self.unseen = self.timed = self.hidden = False
        self.macros = Macros(defines)
        #: Texts read (splices joined), their folders and whether their comments are
        #: blanked already: their #define and #if lines, not taken by the macros yet, are
        #: needed only once a macro may give an include its name.
        self.untaken: list[tuple[bytes, str, bool]] = []
        #: Each include whose name a macro gives.
        self.operands: list[Operand] = []
        self.followed: set[tuple[bool, str, str]] = set()

    def read_all(self) -> None:
        """Read every text pending and every text their includes lead to."""
        while self.pending:
            raw, here = self.pending.pop()
            text = _unspliced(raw)
            cleaned = any(word in text for word in _SCANNED_WORDS)
            clean = strip_comments(text) if cleaned else text
            self.untaken.append((clean, here, cleaned))
            probes_unseen, uses_time = _untracked_in(clean)
            self.unseen, self.timed = self.unseen or probes_unseen, self.timed or uses_time
            macro_include = _in_code(_MACRO_INCLUDE, clean, b"include", b"import")
            self.hidden = self.hidden or macro_include
            if macro_include or probes_unseen:
                self.operands += operands(clean, here)
            for quoted, include in _names(clean):
                self.follow(quoted, include, here)

    def follow_macro_includes(self) -> bool:
        """Follow every name the macro-built includes (and ``__has_include``) may give;
        True when that found a text not read yet. Raises InvalidArgument where the names
        cannot be bounded."""
        for text, here, cleaned in self.untaken:
            self.macros.add_text(text if cleaned else strip_comments(text), here)
        self.untaken.clear()
        for operand in [*self.operands, *self.macros.probe_calls()]:
            try:
                names = include_names(operand, self.macros)
            except Unresolved as exc:
                raise InvalidArgument(
                    f"{operand.spelled!r}: the scan cannot tell which file this names: {exc}."
                    " NVRTC could hang on a FIFO there; spell the name out, or pass the"
                    " header in headers"
                ) from None
            for quoted, include in names:
                self.follow(quoted, include, operand.here, spelled=operand.spelled)
        return bool(self.pending)

    def follow(self, quoted: bool, include: str, here: str, *, spelled: str = "") -> None:
        """Find ``include`` as NVRTC would, refuse what it must not open, queue its text.
        ``spelled``: the macro operand that gave the name, for the message."""
        if include in self.headers or (quoted, include, here) in self.followed:
            return
        self.followed.add((quoted, include, here))
        roots = ([here] if quoted else []) + self.include_paths
        candidates = (
            [include] if os.path.isabs(include) else [os.path.join(root, include) for root in roots]
        )
        for candidate in candidates:
            if candidate in self.files:
                return
            self.probed.append(candidate)
            content = read_regular(candidate)
            if content is None:
                continue
            if isinstance(content, Unreadable):
                if not content.hazard:
                    continue  # NVRTC says "cannot open source file"; nothing hangs
                given_as = f" (as {spelled})" if spelled else ""
                raise InvalidArgument(
                    f"#include {include!r}{given_as}: {candidate!r} {content.reason}; an "
                    "include must name a regular file"
                )
            self.budget -= len(content)
            if self.budget < 0:
                raise InvalidArgument(
                    f"the includes of {self.name!r} add up to more than {MAX_SCAN_BYTES} bytes"
                )
            self.files[candidate] = b"sha256:" + hashlib.sha256(content).digest()
            self.pending.append((content, os.path.dirname(candidate)))
            return


def scan_includes(
    source: str,
    *,
    headers: Mapping[str, str],
    include_paths: Sequence[str],
    name: str,
    defines: Mapping[str, str | None] | None = None,
) -> IncludeScan:
    """Follow the includes of ``source`` the way NVRTC resolves them; raise
    InvalidArgument for one that leads to a FIFO, a device, a socket or an oversized file.

    Resolution: a name listed in ``headers`` is that header; otherwise a quoted include
    is looked for next to the including file (for the source and in-memory headers: the
    directory of the program ``name``, the working directory for a bare name), then on
    each include path in order; an angle include on the include paths only. An include
    whose name a macro gives (``#include HEADER``, ``__has_include(HEADER)``, a macro
    wrapping ``__has_include`` used in an ``#if``) is followed to every name the macros
    of the texts read and ``defines`` (the ``-D`` options) may give it
    (``include_macros.py``); one whose names cannot be bounded is refused.
    """
    source_dir = os.path.dirname(name)
    scanner = _Scanner(headers, include_paths, defines or {}, name)
    scanner.pending = [(source.encode("utf-8"), source_dir)]
    scanner.pending += [(text.encode("utf-8"), source_dir) for text in headers.values()]
    given = reads_no_file([text for text, _here in scanner.pending])
    scanner.read_all()
    # A __has_include whose operand is not spelled out (in a #define too) may be named
    # by a macro: only then are the texts' macros worth taking.
    while (scanner.operands or scanner.unseen) and scanner.follow_macro_includes():
        scanner.read_all()
    return IncludeScan(
        files=scanner.files,
        probed=tuple(dict.fromkeys(scanner.probed)),
        reads_no_file=given,
        unseen_probes=scanner.unseen,
        time_macros=scanner.timed,
        macro_includes=scanner.hidden,
    )
