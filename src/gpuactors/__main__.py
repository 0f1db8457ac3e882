"""``python -m gpuactors``: the same command line as the ``gpuactors`` script."""

from __future__ import annotations

from gpuactors.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
