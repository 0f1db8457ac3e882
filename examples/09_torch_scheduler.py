"""A small model's forward pass with its tiny ops batched (skipped where torch is missing).

Inside ``with scheduler:`` the layer norm, GELU, residual add and softmax of an MLP
block are queued and run as a few kernels that interpret a small op program, with no
compile per op chain; the two matrix products run in PyTorch (the scheduler flushes
the queued ops before each one). The same forward pass runs twice: with the batches
launched on PyTorch's stream (the default) and as tasks of an engine. Both results are
checked against eager PyTorch.

Run on a GPU machine:  CUDA_MODULE_LOADING=EAGER python examples/09_torch_scheduler.py
"""

from __future__ import annotations

from typing import Any

# The interpreter both ways run (torch-free modules: the CPU tests compile them).
from gpuactors.torch.kernel import PROGRAM_OP, STREAM_SOURCE  # noqa: F401


def build_block(width: int) -> Any:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        """Pre-norm MLP block, then a softmax over the features."""

        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(width, 4 * width)
            self.fc2 = nn.Linear(4 * width, width)
            self.gamma = nn.Parameter(torch.ones(width))
            self.beta = nn.Parameter(torch.zeros(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            centered = x - x.mean(-1, keepdim=True)
            var = (centered * centered).mean(-1, keepdim=True)
            h = centered * torch.rsqrt(var + 1e-5) * self.gamma + self.beta
            h = self.fc2(F.gelu(self.fc1(h), approximate="tanh"))
            y = x + 0.5 * h
            e = (y - y.amax(-1, keepdim=True)).exp()
            return e / e.sum(-1, keepdim=True)

    return Block().cuda().eval()


def run() -> bool:
    import torch

    from gpuactors.torch import LocalEngine, stream_scheduler

    torch.manual_seed(9)
    model = build_block(64)
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad(), LocalEngine() as engine:
        expected = model(x)
        for where, scheduler in (
            ("launched on PyTorch's stream", stream_scheduler()),
            ("run by an engine", engine.scheduler()),
        ):
            with scheduler:
                got = model(x)
            scheduler.close()
            stats = scheduler.stats
            print(
                f"{where}: {stats.ops} tiny ops in {stats.batches} batches; {stats.fallbacks}"
                " ops ran in PyTorch (the matrix products and their views)"
            )
            if not torch.allclose(got, expected, rtol=1e-4, atol=1e-6):
                print(f"FAIL: largest difference {float((got - expected).abs().max()):.3g}")
                return False
    print(f"PASS: the block's output equals eager PyTorch both ways ({tuple(got.shape)}, float32)")
    return True


def main() -> int:
    try:
        import torch
    except ImportError:
        print("torch not installed, skipping")
        return 0
    if not torch.cuda.is_available():
        print("torch has no CUDA device here, skipping")
        return 0
    return 0 if run() else 1


if __name__ == "__main__":
    raise SystemExit(main())
