"""The README's set-up commands, CI's script and the console script agree."""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The commands of the README's first code block, as .ci/run reads them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^```(?:bash|sh|shell|console)?[ \t]*\n(.*?)^```", text, re.M | re.S)
    assert match, "README.md has no code block"
    lines = [line.strip() for line in match.group(1).splitlines()]
    return [line.removeprefix("$ ") for line in lines if line and not line.startswith("#")]


def test_readme_opens_with_install_and_test_commands() -> None:
    install, test = readme_commands()
    assert install.startswith("pip install -e ") and "[dev]" in install
    assert "cuda1" not in install, "CI has no GPU: the first command must not pull CuPy"
    assert install.endswith("gpuactors doctor")
    assert test.startswith("python -m pytest")


def test_readme_block_comes_right_after_the_tagline() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    prose = [line for line in lines[: lines.index("```bash")] if line.strip()]
    assert len(prose) == 2 and prose[0].startswith("# ")


def test_ci_script_is_executable_and_strict() -> None:
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK)
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    assert "README.md" in text and "mypy --strict src" in text


def test_console_script_target_exists() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    target = project["scripts"]["gpuactors"]
    module_name, _, func_name = target.partition(":")
    assert callable(getattr(importlib.import_module(module_name), func_name))
