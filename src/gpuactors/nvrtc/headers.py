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
from .include_macros import (
    Macros,
    Name,
    Operand,
    Unresolved,
    comment_free_readings,
    name_forms,
    names_of,
    operands,
    spelled_probes,
    unspelled_includes,
    unspelled_probes,
)

#: The largest header a compile may read (NVRTC would take more; nothing sane needs it).
MAX_HEADER_BYTES = 64 * 1024 * 1024
#: The most bytes the scan reads over all the files it follows.
MAX_SCAN_BYTES = 512 * 1024 * 1024

ABSENT = b"absent"
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

# Translation phases 1 to 3 before matching directives: line splices go, comments become
# blanks (``include_macros.comment_free_readings`` keeps literals and <names> whole).
# NVRTC (C++17) joins a line only at a backslash right before its end; a ``??/`` trigraph
# (C++11 and 14 may read trigraphs) or a blank after the backslash is read both ways.
_SPLICE = re.compile(rb"\\\r?\n")
_LOOSE_SPLICE = re.compile(rb"(?:\\|\?\?/)[ \t]*\r?\n")
_LOOSE_ONLY = re.compile(rb"\?\?/[ \t]*\r?\n|\\[ \t]+\r?\n")
# Directives are matched in "\n" + text, each from the "\n" before it: a literal first
# lets the search skip from line to line.
_DIRECTIVE_HEAD = rb"\n[ \t\f\v]*(?:#|%:|\?\?=)[ \t\f\v]*(include_next|include|import)[ \t\f\v]*"
# A quoted name may hold a '>', an angle name a '"'.
_DIRECTIVE = re.compile(_DIRECTIVE_HEAD + rb'(?:"([^"\r\n]+)"|<([^>\r\n]+)>)')
# The preprocessor opens a file only for a directive or operator spelled with one of
# these words (a macro cannot expand to a directive); a universal character name could
# spell them otherwise. A text without any reads no file.
_FILE_WORDS = (b"include", b"import", b"embed", b"\\u", b"\\U")
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
    #: ``__has_include`` of a macro, or one not followed by ``(`` and a spelled name):
    #: NVRTC reports no read of an absent file, so no key can cover whether it appears.
    unseen_probes: bool = False
    #: True when a text uses ``__DATE__``, ``__TIME__`` or ``__TIMESTAMP__``: its module
    #: holds the moment it was compiled.
    time_macros: bool = False
    #: True when a text includes a name a macro gives (``#include MACRO``): NVRTC may
    #: then read files the scan did not follow.
    macro_includes: bool = False


def _splice_readings(text: bytes) -> list[bytes]:
    """``text`` with its line splices joined: as NVRTC (C++17) joins them, and, where a
    ``??/`` or a blank after a backslash ends a line, as a lenient reader would too."""
    if b"\\" not in text and b"??/" not in text:
        return [text]
    strict = _SPLICE.sub(b"", text)
    maybe_loose = any(start in text for start in (b"??/", b"\\ ", b"\\\t"))
    if not maybe_loose or _LOOSE_ONLY.search(text) is None:
        return [strict]
    return [strict, _LOOSE_SPLICE.sub(b"", text)]


def _clean_readings(spliced: Sequence[bytes]) -> list[bytes]:
    """Every reading of a text its directives are matched in, from its ``spliced``
    readings (:func:`_splice_readings`): comments blanked (each way)."""
    found: dict[bytes, None] = {}
    for reading in spliced:
        found.update(dict.fromkeys(comment_free_readings(reading)))
    return list(found)


def reads_no_file(texts: Sequence[bytes]) -> bool:
    """Whether these texts, compiled together, can make NVRTC open no file at all."""
    return not any(
        word in reading
        for text in texts
        for reading in _splice_readings(text)
        for word in _FILE_WORDS
    )


_PLAIN_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"\r\n]+)"[ \t]*$', re.MULTILINE)


def includes_only_given(texts: Sequence[str], given: Collection[str]) -> bool:
    """Whether these texts can make NVRTC open no file once each plain ``#include "name"``
    of a header in ``given`` is set aside: NVRTC takes an in-memory header before any
    file of that name. For an NVRTC that cannot report its reads (NVRTC 12), so that
    sources built from in-memory headers alone (the engine's) keep a cacheable key.
    Conservative: any other word that could open a file, in a comment too, says no."""
    for text in texts:
        for reading in _splice_readings(text.encode("utf-8")):
            rest = _PLAIN_INCLUDE.sub(
                lambda m: b"" if m.group(1).decode("utf-8", "replace") in given else m.group(0),
                reading,
            )
            if not reads_no_file([rest]):
                return False
    return True


# Words in every match of the patterns the scan looks for: a text without them is
# passed over without removing its comments.
_SCANNED_WORDS = (b"include", b"import", b"__DATE__", b"__TIME")


def _spelled_names(text: bytes) -> list[Name]:
    """Every name an include or ``__has_include`` spells out in ``text``."""
    if b"include" not in text and b"import" not in text:  # the usual case, cheaply
        return []
    found = []
    for match in _DIRECTIVE.finditer(b"\n" + text):
        quoted = match.group(2) is not None
        name = (match.group(2) if quoted else match.group(3)).decode("utf-8", "replace")
        resumes = match.group(1) == b"include_next"
        found += [Name(quoted, form, resumes) for form in name_forms(name)]
    return found + [name for _start, name in spelled_probes(text)]


def _in_code(pattern: re.Pattern[bytes], clean: bytes, *words: bytes) -> bool:
    """Whether ``pattern`` matches a cleaned text; ``words``: one of them is in any match
    (so most texts are passed over cheaply)."""
    return any(word in clean for word in words) and pattern.search(clean) is not None


def _untracked_in(clean: bytes) -> tuple[bool, bool]:
    return (
        next(unspelled_probes(clean), None) is not None,
        _in_code(_TIME_MACROS, clean, b"__DATE__", b"__TIME"),
    )


def holds_untracked_input(text: bytes) -> tuple[bool, bool]:
    """``(unseen_probes, time_macros)`` of one text NVRTC reads (see :class:`IncludeScan`)."""
    found = [_untracked_in(clean) for clean in _clean_readings(_splice_readings(text))]
    return any(unseen for unseen, _ in found), any(timed for _, timed in found)


def unscanned_untracked_input(paths: Sequence[str]) -> bool:
    """Whether one of the files at ``paths`` (read by NVRTC, not by the scan: an
    ``#include MACRO`` led there) probes for a file it names by a macro or uses a time
    macro: its module is then one no key can name, as for a text the scan read."""
    for path in paths:
        content = read_regular(path)
        if isinstance(content, bytes) and any(holds_untracked_input(content)):
            return True
    return False


def _refusal(what: str, why: Unresolved) -> InvalidArgument:
    return InvalidArgument(
        f"{what}: the scan cannot tell which file this names: {why}. NVRTC could hang on"
        " a FIFO there; spell the name out, or pass the header in headers"
    )


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
        #: Readings of the texts read (splices joined), their folders and whether their
        #: comments are blanked already: their #define and #if lines, not taken by the
        #: macros yet, are needed only once a macro may give an include its name.
        self.untaken: list[tuple[bytes, str, bool]] = []
        #: Each include whose name a macro gives (once: a text may repeat one).
        self.operands: dict[Operand, None] = {}
        self.followed: set[tuple[Name, str]] = set()

    def read_all(self) -> None:
        """Read every text pending and every text their includes lead to."""
        while self.pending:
            raw, here = self.pending.pop()
            readings = _splice_readings(raw)
            if not any(word in readings[-1] for word in _SCANNED_WORDS):
                self.untaken += [(reading, here, False) for reading in readings]
                continue
            # The spelled names of the text with its comments left in too: a safety net
            # should the comment removal take code for a comment (the scan may follow
            # more than NVRTC does: it only hashes files and checks their types).
            names = [name for reading in readings for name in _spelled_names(reading)]
            for clean in _clean_readings(readings):
                self.untaken.append((clean, here, True))
                self._note_untracked(clean, here)
                names += _spelled_names(clean)
            for named in dict.fromkeys(names):
                self.follow(named, here)

    def _note_untracked(self, clean: bytes, here: str) -> None:
        """Note what in a cleaned text no key can cover, and the includes a macro names."""
        probes_unseen, uses_time = _untracked_in(clean)
        self.unseen, self.timed = self.unseen or probes_unseen, self.timed or uses_time
        macro_include = unspelled_includes(clean)
        self.hidden = self.hidden or macro_include
        if macro_include or probes_unseen:
            try:
                self.operands.update(dict.fromkeys(operands(clean, here, self.macros.budget)))
            except Unresolved as exc:
                raise _refusal(f"a text in {here or '.'!r}", exc) from None

    def follow_macro_includes(self) -> bool:
        """Follow every name the macro-built includes (and ``__has_include``) may give;
        True when that found a text not read yet. Raises InvalidArgument where the names
        cannot be bounded."""
        for text, here, cleaned in self.untaken:
            for clean in [text] if cleaned else comment_free_readings(text):
                self.macros.add_text(clean, here)
        self.untaken.clear()
        try:
            probe_calls = self.macros.probe_calls()
        except Unresolved as exc:
            raise _refusal("an #if", exc) from None
        for operand in dict.fromkeys([*self.operands, *probe_calls]):
            try:
                names = names_of(operand, self.macros)
            except Unresolved as exc:
                raise _refusal(repr(operand.spelled[:200]), exc) from None
            for named in names:
                self.follow(named, operand.here, spelled=operand.spelled)
        return bool(self.pending)

    def follow(self, named: Name, here: str, *, spelled: str = "") -> None:
        """Find ``named`` as NVRTC would, refuse what it must not open, queue its text.
        ``spelled``: the macro operand that gave the name, for the message. An
        ``#include_next`` is followed into every folder: where its search resumes
        depends on where its includer was found, which the scan does not track."""
        if named.name in self.headers or (named, here) in self.followed:
            return
        self.followed.add((named, here))
        roots = ([here] if named.quoted else []) + self.include_paths
        include = named.name
        if os.path.isabs(include):
            candidates = [include]
        else:
            candidates = [os.path.join(root, include) for root in roots]
        for candidate in candidates:
            if self._is_file(candidate, include, spelled) and not named.resumes:
                return

    def _is_file(self, candidate: str, include: str, spelled: str) -> bool:
        """Whether a file is at ``candidate`` (read, hashed and queued when new); raises
        InvalidArgument when NVRTC would hang on what is there or read it without end."""
        if candidate in self.files:
            return True
        self.probed.append(candidate)
        content = read_regular(candidate)
        if content is None:
            return False
        if isinstance(content, Unreadable):
            if not content.hazard:
                return False  # NVRTC says "cannot open source file"; nothing hangs
            given_as = f" (as {spelled[:200]})" if spelled else ""
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
        return True


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
    is looked for next to the including file (for the source: the directory of the
    program ``name``; for an in-memory header: the directory of its own name; the working
    directory for a bare name), then on each include path in order; an angle include on
    the include paths only. An include whose name a macro gives (``#include HEADER``,
    ``__has_include(HEADER)``, a macro wrapping ``__has_include`` used in an ``#if``) is
    followed to every name the macros of the texts read, ``defines`` (the ``-D``
    options) and NVRTC's own may give it (``include_macros.py``); one whose names cannot
    be bounded is refused.
    """
    scanner = _Scanner(headers, include_paths, defines or {}, name)
    scanner.pending = [(source.encode("utf-8"), os.path.dirname(name))]
    scanner.pending += [
        (text.encode("utf-8"), os.path.dirname(header)) for header, text in headers.items()
    ]
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
