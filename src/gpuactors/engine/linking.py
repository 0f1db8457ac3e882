"""The device libraries of an engine module: which ones, how the module is compiled for
them, and the link that makes the loaded image.

An op whose body calls a function compiled apart names it in
``OpSpec.device_libraries``. Every op lives in ONE engine module (codegen.py), so the
module links the libraries of all its ops (each distinct image once). Without
libraries nothing here runs: the module is compiled whole, as before.

With libraries the module is compiled relocatable and linked by nvJitLink (the
linker of :mod:`gpuactors.nvrtc.linker`: it needs no GPU, and it is the only linker
that takes LTO-IR). When a library is LTO-IR the module is compiled to LTO-IR too, so
the link optimises across both (a library function can be inlined into an op);
otherwise to a relocatable CUBIN, linked without LTO (nothing to optimise across, and
the link takes milliseconds instead of a second).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gpuactors.engine.ops import DeviceLibrary, OpSpec
from gpuactors.nvrtc import CompiledModule, KernelLinker, LinkInput, NvrtcOpts, default_linker

#: The name of the engine module's own input in a link (and in the linker's logs).
ENGINE_INPUT_NAME = "gpa_engine.cu"


def engine_libraries(ops: Sequence[OpSpec]) -> tuple[DeviceLibrary, ...]:
    """Every distinct device library ``ops`` name, in order of first mention.

    A library two ops name (the same image) is linked once, with the declarations of
    both (they may declare different functions of it). Two different images of one
    name are told apart in the linker's logs by the op that names each.
    """
    seen: dict[tuple[str, bytes], DeviceLibrary] = {}
    names = {ENGINE_INPUT_NAME}
    for op in ops:
        for library in op.device_libraries:
            identity = (library.image.kind, hashlib.sha256(library.image.image).digest())
            known = seen.get(identity)
            if known is not None:
                if library.declarations not in known.declarations:
                    declarations = f"{known.declarations}\n{library.declarations}"
                    seen[identity] = DeviceLibrary(image=known.image, declarations=declarations)
                continue
            if library.name in names:
                renamed = library.image.model_copy(
                    update={"name": f"{library.name} (op {op.name}@{op.version})"}
                )
                library = DeviceLibrary(image=renamed, declarations=library.declarations)
            names.add(library.name)
            seen[identity] = library
    return tuple(seen.values())


def engine_compile_opts(base: NvrtcOpts, libraries: Sequence[DeviceLibrary]) -> NvrtcOpts:
    """``base`` (the engine's options), made relocatable when there are libraries to
    link: LTO-IR if one of them is LTO-IR, else a relocatable CUBIN."""
    if not libraries:
        return base
    lto = any(library.image.kind == "ltoir" for library in libraries)
    return NvrtcOpts(**{**dict(base), "relocatable": True, "output": "ltoir" if lto else "cubin"})


def declarations_source(libraries: Sequence[DeviceLibrary]) -> str:
    """The libraries' declarations, each under a ``#line`` naming its library (so a
    compile error in them points there), for the top of the engine module."""
    return "".join(
        f'#line 1 "library:{_quoted(library.name)}"\n{library.declarations}\n'
        for library in libraries
        if library.declarations.strip()
    )


def _quoted(name: str) -> str:
    """``name`` as the inside of a C string literal (a ``#line`` file name)."""
    return name.replace("\\", "\\\\").replace('"', '\\"')


def _link_inputs(module: CompiledModule, libraries: Sequence[DeviceLibrary]) -> list[LinkInput]:
    return [LinkInput.of(module, ENGINE_INPUT_NAME), *(library.image for library in libraries)]


def find_linked_in_memory(
    module: CompiledModule,
    libraries: Sequence[DeviceLibrary],
    *,
    arch: str,
    linker: KernelLinker | None = None,
) -> CompiledModule | None:
    """The linked engine image if the linker's memory cache holds it (no link, no file)."""
    linker = linker or default_linker()
    key = linker.key_of(_link_inputs(module, libraries), arch=arch, name="gpa_engine")
    return linker.memory.get(key)


def link_engine_module(
    module: CompiledModule,
    libraries: Sequence[DeviceLibrary],
    *,
    arch: str,
    linker: KernelLinker | None = None,
) -> CompiledModule:
    """The relocatable engine ``module`` linked with ``libraries`` (through the caches:
    the key covers every library's bytes). Raises :class:`LinkError` when the linker
    refuses."""
    linker = linker or default_linker()
    inputs = _link_inputs(module, libraries)
    linked, _origin = linker.get_or_link(inputs, arch=arch, name="gpa_engine")
    return linked
