"""What a compile produces: the binary image and what is known about it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .options import OutputKind


@dataclass(frozen=True)
class CompiledModule:
    """One NVRTC output (CUBIN, PTX or LTO-IR) plus its metadata.

    ``lowered_names`` maps each requested name expression (``"k<float>"``) to the
    mangled symbol NVRTC reported for it (``"_Z1kIfEvPT_i"``): look kernels up with
    :meth:`symbol` (a cached module is shared: treat the mapping as read-only).
    ``log`` is NVRTC's full log, kept on success so warnings are not
    lost; ``warnings`` are its warning lines. ``image`` is exactly what NVRTC returned
    (PTX keeps its terminating NUL).
    """

    image: bytes
    kind: OutputKind
    lowered_names: dict[str, str] = field(hash=False)
    log: str
    warnings: tuple[str, ...]
    arch: str
    nvrtc_version: tuple[int, int]
    compile_seconds: float
    cache_key: str
    source_name: str = "kernel.cu"
    #: The rendered NVRTC options the image was built with.
    options: tuple[str, ...] = ()

    def symbol(self, name: str) -> str:
        """The symbol to look ``name`` up by: its lowered name if it was a name
        expression, else ``name`` itself (an ``extern "C"`` kernel keeps its name)."""
        return self.lowered_names.get(name, name)

    def __repr__(self) -> str:
        return (
            f"CompiledModule(kind={self.kind!r}, arch={self.arch!r}, "
            f"bytes={len(self.image)}, names={sorted(self.lowered_names)!r}, "
            f"warnings={len(self.warnings)}, key={self.cache_key[:12]}...)"
        )
