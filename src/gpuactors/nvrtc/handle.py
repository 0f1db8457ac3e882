"""KernelHandle: a compiled module, the kernels to launch from it, and where it may run.

A handle is plain data: it holds the image, never a loaded CUDA module, so it is
made (and tested) without a GPU. The actor that launches it loads the module on
first use. The handle records the device generation it was made in; after the
device's context is rebuilt, using it raises
:class:`~gpuactors.errors.GpuRefStale` (compile again: usually a cache hit).

The kernels and their parameter sizes are read from the image itself (the
CUBIN's symbol table and ``.nv.info`` attributes, or the PTX ``.entry``
declarations), so a Launch's argument count and scalar sizes are checked for
template kernels too. Where an image cannot be read that way, those checks are
skipped.
"""

from __future__ import annotations

import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuactors.errors import InvalidArgument
from gpuactors.nvrtc.kernel_compiler import Origin
from gpuactors.nvrtc.module import CompiledModule

#: A kernel's parameter sizes in bytes (None where the image does not say).
Params = tuple[int, ...] | None
#: Symbol -> parameter sizes, for every kernel entry found in an image.
Entries = dict[str, Params]


@dataclass(frozen=True, eq=False)
class KernelHandle:
    """Compiled kernels, ready to launch on ``device_id`` during ``generation``.

    ``kernels`` maps each requested kernel name to the symbol it is launched by
    (its lowered name for a name expression, itself for an ``extern "C"`` kernel);
    ``params`` maps the same names to the kernel's parameter sizes in bytes.
    ``origin`` says where the module came from: ``"compiled"``, ``"memory"`` or
    ``"disk"``.
    """

    module: CompiledModule
    kernels: Mapping[str, str]
    params: Mapping[str, Params]
    device_id: int
    generation: int
    origin: Origin

    @property
    def names(self) -> tuple[str, ...]:
        """The kernel names this handle launches, as requested."""
        return tuple(self.kernels)

    @property
    def image(self) -> bytes:
        return self.module.image

    @property
    def cache_key(self) -> str:
        return self.module.cache_key

    @property
    def log(self) -> str:
        """NVRTC's full log (kept on success, for its warnings)."""
        return self.module.log

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.module.warnings

    @property
    def compile_seconds(self) -> float:
        return self.module.compile_seconds

    @property
    def lowered_names(self) -> Mapping[str, str]:
        return self.module.lowered_names

    def resolve(self, name: str | None) -> tuple[str, str, Params]:
        """``(name, symbol, params)`` of the kernel to launch; InvalidArgument if unknown.

        ``None`` picks the only kernel of a single-kernel handle.
        """
        if name is None:
            if len(self.kernels) != 1:
                raise InvalidArgument(
                    f"this handle holds {len(self.kernels)} kernels "
                    f"({', '.join(self.kernels)}): name the one to launch"
                )
            name = next(iter(self.kernels))
        symbol = self.kernels.get(name)
        if symbol is None:
            raise InvalidArgument(
                f"no kernel {name!r} in this handle (it holds: {', '.join(self.kernels)})"
            )
        return name, symbol, self.params[name]

    def __repr__(self) -> str:
        return (
            f"KernelHandle({self.module.source_name!r}, kernels={list(self.kernels)!r}, "
            f"arch={self.module.arch!r}, device={self.device_id}, "
            f"generation={self.generation}, origin={self.origin!r})"
        )


def make_handle(
    module: CompiledModule,
    kernel_names: tuple[str, ...],
    *,
    device_id: int,
    generation: int,
    origin: Origin,
) -> KernelHandle:
    """A handle for ``kernel_names`` in ``module``; InvalidArgument for a name that is
    not a kernel of the image (when the image can be read)."""
    entries = kernel_entries(module)
    kernels: dict[str, str] = {}
    params: dict[str, Params] = {}
    for name in kernel_names:
        symbol = module.symbol(name)
        if entries is not None and symbol not in entries:
            raise InvalidArgument(_not_a_kernel(module, name, symbol, entries))
        kernels[name] = symbol
        params[name] = None if entries is None else entries[symbol]
    return KernelHandle(
        module=module,
        kernels=MappingProxyType(kernels),
        params=MappingProxyType(params),
        device_id=device_id,
        generation=generation,
        origin=origin,
    )


def _not_a_kernel(module: CompiledModule, name: str, symbol: str, entries: Entries) -> str:
    found = ", ".join(sorted(entries)) or "none"
    what = f"{name!r}" if symbol == name else f"{name!r} (lowered to {symbol!r})"
    hint = ""
    if name not in module.lowered_names:
        hint = (
            '; a template or C++ (not extern "C") kernel must also be listed in '
            "opts.name_expressions, e.g. NvrtcOpts(name_expressions=('scale<float>',))"
        )
    return f"{what} is not a kernel of {module.source_name!r} (kernels found: {found}){hint}"


# ------------------------------------------------------------- reading images
_ENTRY_CACHE: OrderedDict[str, Entries | None] = OrderedDict()
_ENTRY_CACHE_SIZE = 512
_entry_lock = threading.Lock()


def kernel_entries(module: CompiledModule) -> Entries | None:
    """The kernels of a CUBIN or PTX image and their parameter sizes; None when the
    image is of another kind or cannot be read. Cached by the module's cache key."""
    key = module.cache_key
    with _entry_lock:
        if key in _ENTRY_CACHE:
            _ENTRY_CACHE.move_to_end(key)
            return _ENTRY_CACHE[key]
    entries: Entries | None
    try:
        if module.kind == "cubin":
            entries = cubin_entries(module.image)
        elif module.kind == "ptx":
            entries = ptx_entries(module.image)
        else:
            entries = None
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        entries = None  # an image we cannot read: launch checks are skipped, not guessed
    with _entry_lock:
        _ENTRY_CACHE[key] = entries
        if len(_ENTRY_CACHE) > _ENTRY_CACHE_SIZE:
            _ENTRY_CACHE.popitem(last=False)
    return entries


_ELF_HEADER = struct.Struct("<4sBB10xHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_KPARAM = struct.Struct("<IHHI")
_EM_CUDA = 190
_SHT_SYMTAB = 2
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10
_EIATTR_KPARAM_INFO = 0x17
_EIFMT_SVAL = 4
_INFO_PREFIX = ".nv.info."


def _c_string(image: bytes, offset: int) -> str:
    return image[offset : image.index(b"\0", offset)].decode("utf-8")


def cubin_entries(image: bytes) -> Entries | None:
    """Kernel symbols of a CUBIN (ELF) and their parameter sizes, from the symbol table
    (entries carry ``STO_CUDA_ENTRY``) and each kernel's ``.nv.info.<name>``
    ``EIATTR_KPARAM_INFO`` records. None if this is not a 64-bit CUDA ELF."""
    header = _ELF_HEADER.unpack_from(image, 0)
    magic, elf_class, data, machine, shoff = header[0], header[1], header[2], header[4], header[8]
    shentsize, shnum, shstrndx = header[13:16]
    if magic != b"\x7fELF" or elf_class != 2 or data != 1 or machine != _EM_CUDA:
        return None
    sections = [_SECTION.unpack_from(image, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    by_name = {_c_string(image, names_at + s[0]): s for s in sections}
    symbols: list[str] = []
    for _name, kind, _fl, _ad, offset, size, link, _i, _al, entsize in sections:
        if kind != _SHT_SYMTAB:
            continue
        strings_at = sections[link][4]
        step = entsize or _SYMBOL.size
        for at in range(offset, offset + size, step):
            st_name, st_info, st_other, _shndx, _value, _size = _SYMBOL.unpack_from(image, at)
            if st_info & 0xF == _STT_FUNC and st_other & _STO_CUDA_ENTRY:
                symbols.append(_c_string(image, strings_at + st_name))
    entries: Entries = {}
    for symbol in symbols:
        info = by_name.get(_INFO_PREFIX + symbol)
        entries[symbol] = None if info is None else _kparam_sizes(image, info[4], info[5])
    return entries


def _kparam_sizes(image: bytes, offset: int, size: int) -> Params:
    """Parameter sizes from one ``.nv.info.<kernel>`` section (None if unreadable)."""
    sizes: dict[int, int] = {}
    at, end = offset, offset + size
    while at < end:
        fmt, attr = image[at], image[at + 1]
        if fmt == _EIFMT_SVAL:
            (length,) = struct.unpack_from("<H", image, at + 2)
            value_at, at = at + 4, at + 4 + length
            if attr == _EIATTR_KPARAM_INFO:
                _index, ordinal, _offset, flags = _KPARAM.unpack_from(image, value_at)
                sizes[ordinal] = (flags >> 18) & 0x3FFF
        elif fmt in (1, 2, 3):  # no value / byte / half-word: one 4-byte record
            at += 4
        else:
            return None
    if sorted(sizes) != list(range(len(sizes))):
        return None
    return tuple(sizes[i] for i in range(len(sizes)))


_PTX_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(([^)]*)\)")
_PTX_PARAM = re.compile(
    r"^\s*\.param\s+(?:\.align\s+\d+\s+)?\.[a-z]+?(\d+)\b[^\[]*?(?:\[(\d+)\])?\s*$"
)


def ptx_entries(image: bytes) -> Entries:
    """Kernel entries of a PTX text and their parameter sizes."""
    text = image.rstrip(b"\0").decode("utf-8")
    entries: Entries = {}
    for match in _PTX_ENTRY.finditer(text):
        params = [p for p in match.group(2).split(",") if p.strip()]
        sizes: list[int] = []
        for param in params:
            found = _PTX_PARAM.match(param)
            if found is None:
                sizes = []
                break
            bits, count = int(found.group(1)), int(found.group(2) or 1)
            sizes.append(bits // 8 * count)
        entries[match.group(1)] = tuple(sizes) if len(sizes) == len(params) else None
    return entries
