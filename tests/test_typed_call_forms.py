"""The call forms the docs and examples show type-check under a user's ``mypy --strict``.

The package ships ``py.typed``, and a type checker takes a message's ``__init__`` from
its field annotations: a field typed as the form its validator stores (the grid
``(256, 1, 1)``) refused, in a user's strict code, the forms the docs show and the
validator takes (``grid=256``, ``kernel_names="apply"``, a ``CompiledModule`` image,
``args`` as a list, NumPy numbers: docs/configuration.md, docs/linking.md, examples 01,
03, 06 and 12). mypy runs once, in process, on a user's package of two modules: one
of documented forms that must pass, and one of wrong values that must still be refused
(so a pass is not mypy seeing ``Any``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

pytestmark = pytest.mark.slow  # about 10 s: mypy reads gpuactors, pydantic and NumPy

SOURCE = Path(__file__).resolve().parents[1] / "src"

IMPORTS = """\
from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from typing_extensions import assert_type

from gpuactors.engine import (
    AliasOp, ArrayParam, DeviceLibrary, Enqueue, EnqueueBatch, OpSpec, Park, Resume,
)
from gpuactors.nvrtc import (
    Compile, CompileAsync, KernelHandle, Launch, Link, LinkAsync, LinkInput, NvrtcOpts,
    compile_source,
)
from gpuactors.nvrtc.messages import Dims
"""

DOCUMENTED = IMPORTS + textwrap.dedent(
    """
    def documented(handle: KernelHandle, piece: LinkInput, y: Any, x: Any) -> None:
        launch = Launch(kernel=handle, grid=40, block=256, args=[y, np.int32(3)])
        Launch(kernel=handle, grid=(4, 2), block=[16, 16], shared_mem=np.int64(0))
        Compile(source="x", kernel_names="apply")
        CompileAsync(source="x", kernel_names=["apply", "scale"])
        Link(inputs=(piece, handle), kernel_names="apply")
        LinkAsync(inputs=(piece,), kernel_names="apply")
        module = compile_source("x", opts=NvrtcOpts(arch="sm_90", relocatable=True))
        DeviceLibrary(image=module, declarations="")
        DeviceLibrary(image=handle)
        ArrayParam(name="out", dtype="float32", length=np.int64(256))
        OpSpec(name="op", body="return 0;", version=np.int64(2))
        task = Enqueue(
            op="axpy", args=[y, x, 2.0], n=np.int64(8), blocks=np.int32(2),
            timeout=np.float32(1.5),
        )
        EnqueueBatch(
            op="fill", args=(y, 0.0), n=1024, offsets={"out": [0, 4096]},
            count=np.int64(2), timeout=Fraction(1, 2),
        )
        AliasOp(name="op", version=np.int64(1))
        Park(hold=np.int64(7))
        Resume(hold=None)
        # What the library's own code reads is the checked form.
        assert_type(launch.grid, Dims)
        assert_type(launch.args, tuple[Any, ...])
        assert_type(task.n, int)
        assert_type(task.timeout, float | None)
    """
)

REFUSED = IMPORTS + textwrap.dedent(
    """
    def refused(handle: KernelHandle) -> None:
        Launch(kernel=handle, grid="4", block=256)  # REFUSED
        Compile(source="x", kernel_names=4)  # REFUSED
        DeviceLibrary(image="lib.ltoir")  # REFUSED
        Enqueue(op="axpy", n="4")  # REFUSED
        Enqueue(op="axpy", n=4, args={1, 2})  # REFUSED
        Enqueue(op="axpy", n=4, timeout="1")  # REFUSED
    """
)


@pytest.fixture(scope="module")
def errors_by_module(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """mypy's error lines for each module of the user's package."""
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "documented.py").write_text(DOCUMENTED, encoding="utf-8")
    (folder / "refused.py").write_text(REFUSED, encoding="utf-8")
    # The user's own configuration (not ours), reading this checkout's source.
    config = folder / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {SOURCE}\n", encoding="utf-8")
    stdout, stderr, _status = mypy_api.run(
        [
            "--strict",
            "--config-file",
            str(config),
            "--cache-dir",
            str(folder / "cache"),
            str(folder / "documented.py"),
            str(folder / "refused.py"),
        ]
    )
    assert "error:" in stdout or "Success" in stdout, stdout + stderr  # mypy ran
    found: dict[str, list[str]] = {"documented": [], "refused": []}
    for line in stdout.splitlines():
        path, _, rest = line.partition(".py:")
        if " error: " in rest and Path(path).name in found:
            found[Path(path).name].append(rest)
    return found


def test_documented_call_forms_type_check(errors_by_module: dict[str, list[str]]) -> None:
    errors = errors_by_module["documented"]
    assert not errors, "\n".join(errors)


def test_wrong_values_are_still_refused(errors_by_module: dict[str, list[str]]) -> None:
    lines = REFUSED.splitlines()
    expected = {number for number, line in enumerate(lines, 1) if "# REFUSED" in line}
    reported = {int(error.split(":")[0]) for error in errors_by_module["refused"]}
    assert reported == expected, errors_by_module["refused"]
