"""The tiny-op scheduler on CPU tensors, run by the NumPy twin of the device op.

These check everything the host decides (which ops are taken, the program built for
them, dtype promotion, broadcasting, strided views, in-place and out=, when a batch
is flushed, traced replays) against eager PyTorch, with no GPU. The CUDA interpreter
itself is checked by tests/test_torch_gpu.py on a GPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import io
import pickle
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
F = torch.nn.functional

from gpuactors.errors import InvalidArgument, TaskFailed  # noqa: E402
from gpuactors.torch import ReferenceExecutor, TorchScheduler, trace  # noqa: E402
from gpuactors.torch import program as P  # noqa: E402
from gpuactors.torch.batch import Batch, Decline  # noqa: E402
from gpuactors.torch.executors import MeetingPoints  # noqa: E402
from torch_cases import (  # noqa: E402
    BINARY,
    UNARY,
    KeepsPrograms,
    assert_same,
    chain57,
    flat,
    hooks_taken_out,
    random_case,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(1234)


@pytest.fixture
def sched() -> Any:
    scheduler = TorchScheduler(KeepsPrograms(), auto_flush_ms=None)
    yield scheduler
    scheduler.close()


def both(sched: TorchScheduler, fn: Any, *inputs: Any) -> tuple[Any, Any]:
    """``fn`` under the scheduler and eagerly, each on its own copies of the inputs."""
    mine = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    theirs = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        with sched:
            got = fn(*mine)
        expected = fn(*theirs)
    return (got, mine), (expected, theirs)


def check(sched: TorchScheduler, fn: Any, *inputs: Any, taken: bool = True) -> None:
    """``fn`` gives eager's results under the scheduler; with ``taken``, every op of the
    scheduler's table was taken (views and factories may still run in PyTorch)."""
    declined, ops = sched.stats.declined, sched.stats.ops
    (got, mine), (expected, theirs) = both(sched, fn, *inputs)
    what = getattr(fn, "__name__", "fn")
    assert_same(flat(got) + flat(mine), flat(expected) + flat(theirs), what)
    if taken:
        assert sched.stats.declined == declined and sched.stats.ops > ops, "an op went to PyTorch"


def rand(*shape: int, dtype: Any = torch.float32) -> Any:
    return (torch.rand(shape) * 4 - 2).to(dtype)


# ------------------------------------------------------------- every op, dtype
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_match_eager(sched: TorchScheduler, name: str, dtype: Any) -> None:
    x = rand(4, 33, dtype=dtype)
    x[0, :3] = torch.tensor([float("nan"), 0.0, -0.0])
    check(sched, UNARY[name], x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_match_eager(sched: TorchScheduler, name: str, dtype: Any) -> None:
    a = rand(3, 17, dtype=dtype)
    b = rand(17, dtype=dtype)
    a[0, :4] = torch.tensor([float("nan"), 1.0, 2.0, -2.0])
    b[:4] = torch.tensor([1.0, float("nan"), 2.0, 0.5])
    check(sched, BINARY[name], a, b)


@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "where", "gt"])
def test_mixed_dtypes_promote_as_pytorch(sched: TorchScheduler, name: str) -> None:
    fn = BINARY[name]
    check(sched, fn, rand(2, 9, dtype=torch.float16), rand(9, dtype=torch.bfloat16))
    check(sched, fn, rand(2, 9, dtype=torch.float16), rand(9, dtype=torch.float32))
    # A 0-dim float32 tensor does not widen a float16 op: it is rounded to float16 first.
    check(sched, fn, rand(2, 9, dtype=torch.float16), torch.tensor(0.1234567))
    check(sched, fn, torch.tensor(0.7, dtype=torch.bfloat16), torch.tensor(0.1234567))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_casts_between_the_float_types_and_bool(sched: TorchScheduler, dtype: Any) -> None:
    x = rand(5, 7) * 1000

    def casts(x: Any) -> Any:
        return [x.to(dtype), x.half().to(dtype), x.bfloat16().float(), x.to(torch.bool), x.clone()]

    check(sched, casts, x)
    check(sched, lambda t: t.t().contiguous() * 2, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", ["sum", "mean", "amax"])
def test_last_dim_reductions(sched: TorchScheduler, kind: str, keepdim: bool, dtype: Any) -> None:
    for shape in [(7,), (3, 5), (2, 3, 700), (4, 1)]:
        x = rand(*shape, dtype=dtype)
        check(sched, lambda t: getattr(t.relu() + 1, kind)(dim=-1, keepdim=keepdim), x)
        check(sched, lambda t: getattr(t.transpose(0, -1), kind)(-1, keepdim), x)
    check(sched, lambda t: (t.sum(), t.mean(), t.amax()), rand(9, dtype=dtype))


def test_reduction_results_feed_later_ops(sched: TorchScheduler) -> None:
    def softmax_and_norm(x: Any) -> Any:
        e = (x - x.amax(-1, keepdim=True)).exp()
        p = e / e.sum(-1, keepdim=True)
        centered = x - x.mean(-1, keepdim=True)
        var = (centered * centered).mean(-1, keepdim=True)
        return p, centered * torch.rsqrt(var + 1e-5)

    for dtype in DTYPES:
        check(sched, softmax_and_norm, rand(6, 40, dtype=dtype))


# -------------------------------------------------- in place, out=, views
def test_in_place_and_out_variants(sched: TorchScheduler) -> None:
    def program(x: Any, y: Any) -> Any:
        x.add_(y, alpha=2).relu_()
        x.mul_(0.5).clamp_(-0.5, 0.25)
        torch.sigmoid(y, out=y)
        z = torch.empty_like(x)
        torch.mul(x, y, out=z)
        z.div_(3.0).sub_(x)
        F.gelu(z, approximate="tanh")
        h = x.half()
        h.add_(z)  # a float32 result stored into float16
        x.copy_(torch.tensor(0.5))
        return [z, h, x * y]

    check(sched, program, rand(4, 9), rand(9))


def test_in_place_on_strided_views_of_pending_results(sched: TorchScheduler) -> None:
    def program(x: Any) -> Any:
        y = x * 2
        y[:, ::2].add_(1)  # a view of a pending result, changed in place
        y.t()[1].mul_(-1)
        row = y[0]
        return [y, row + 1, y.sum(-1)]

    check(sched, program, rand(5, 6), taken=False)


def test_a_later_read_through_another_layout_sees_earlier_writes(sched: TorchScheduler) -> None:
    def program(x: Any) -> Any:
        a = x * 3  # read x
        x.add_(1)  # then write it, in the same stage
        b = x.t() * 2  # read it transposed: needs the write first
        x.t().mul_(a.t())  # write through the transposed layout
        return [a, b, x + 0]

    check(sched, program, rand(4, 4), taken=False)


def test_partial_overlap_is_refused_as_pytorch_refuses_it(sched: TorchScheduler) -> None:
    x = rand(8)
    with pytest.raises(RuntimeError), torch.no_grad():
        x[1:].add_(x[:-1])
    x = rand(8)
    with pytest.raises(RuntimeError), torch.no_grad(), sched:
        x[1:].add_(x[:-1])


def test_broadcasting_strided_inputs_and_parameters(sched: TorchScheduler) -> None:
    weight = torch.nn.Parameter(rand(7), requires_grad=False)
    base = rand(6, 14)

    def program(x: Any, b: Any) -> Any:
        v = b[:, ::2]  # strided
        return [x * weight + v, (v.t() + x.t()).t(), torch.where(v > 0, x, weight)]

    check(sched, program, rand(6, 7), base)


# ----------------------------------------------------------- random programs
@pytest.mark.parametrize("chunk", range(4))
def test_random_programs_match_eager(chunk: int) -> None:
    sched = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    for seed in range(chunk * 75, chunk * 75 + 75):
        case = random_case(seed, "cpu")
        with torch.no_grad():
            expected = case.run(case.inputs())
            with sched:
                got = case.run(case.inputs())
        assert_same(got, expected, case.description, case.dtype)
    assert sched.stats.ops > 500


# ------------------------------------------------------------ fallback rules
def test_an_op_the_scheduler_does_not_take_sees_the_batch_first(sched: TorchScheduler) -> None:
    x = rand(4, 8)
    with torch.no_grad(), sched:
        y = torch.sigmoid(x) * 3
        z = torch.cumsum(y, dim=-1)  # not taken: flushes, then runs
        w = y @ y.t()
        assert sched.stats.flushes["fallback"] >= 1
        value = float(y[1, 2].item())
    expected = torch.sigmoid(x) * 3
    torch.testing.assert_close(z, torch.cumsum(expected, dim=-1))
    torch.testing.assert_close(w, expected @ expected.t())
    assert value == pytest.approx(float(expected[1, 2]))


def test_item_and_print_see_the_pending_values(sched: TorchScheduler, capsys: Any) -> None:
    x = torch.tensor([0.25, -1.0])
    with torch.no_grad(), sched:
        y = x * 4 + 1
        assert y[0].item() == 2.0
        z = y * 2
        print(z)  # printing turns dispatch modes off: the wrapped repr flushes
        assert sched.stats.flushes["print"] == 1
    assert "tensor([ 4., -6.])" in capsys.readouterr().out


def test_data_assigned_a_pending_result_keeps_its_values(sched: TorchScheduler) -> None:
    # The textbook update of old code: `.data` is set to a result whose own object
    # dies at once, and the next parameter's results must not take its memory.
    params = [torch.nn.Parameter(rand(6)) for _ in range(3)]
    for p in params:
        p.grad = rand(6)
    expected = [p.detach() - 0.1 * p.grad for p in params]
    with torch.no_grad(), sched:
        for p in params:
            p.data = p.data - 0.1 * p.grad
    for p, want in zip(params, expected, strict=True):
        torch.testing.assert_close(p.detach(), want)
    assert sched.stats.flushes["data"] == 3


def test_data_assignment_then_reads_in_the_same_context(sched: TorchScheduler) -> None:
    def clip_then_use(w: Any, x: Any) -> Any:
        w.data = w.data.clamp(-0.5, 0.5)  # WGAN's weight clipping
        return (w * x).sum(-1)

    def swap_between_reads(x: Any) -> Any:
        a = x * 2
        x.data = torch.tensor([10.0, 20.0, 30.0])  # frees the memory `a` reads
        return a, x * 3

    w = torch.nn.Parameter(rand(8))
    check(sched, clip_then_use, w.detach(), rand(8))
    check(sched, swap_between_reads, torch.tensor([1.0, 2.0, 3.0]))


def test_traced_function_that_assigns_data(sched: TorchScheduler) -> None:
    def clip_then_use(w: Any, x: Any) -> Any:
        w.data = w.data.clamp(-0.1, 0.1)
        return (w * x).sum(-1)

    traced = trace(clip_then_use, sched)
    w, x = torch.nn.Parameter(rand(5)), rand(5)
    w_eager = torch.nn.Parameter(w.detach().clone())
    with torch.no_grad():
        for _ in range(3):  # a recording cannot replay the assignment: run each time
            torch.testing.assert_close(traced(w, x), clip_then_use(w_eager, x))
            torch.testing.assert_close(w.detach(), w_eager.detach())


def test_module_half_inside_the_context(sched: TorchScheduler) -> None:
    # Module._apply casts each parameter and sets `.data` to the cast: layers of one
    # shape would otherwise give one cast's memory to the next.
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))
    expected = [p.detach().half() for p in model.parameters()]
    with torch.no_grad(), sched:
        model.half()
    for p, want in zip(model.parameters(), expected, strict=True):
        assert p.dtype == torch.float16
        torch.testing.assert_close(p.detach(), want)


def test_data_assignment_is_watched_only_inside_a_context(sched: TorchScheduler) -> None:
    hooks_taken_out()
    assert "data" not in torch.Tensor.__dict__
    t = torch.zeros(2)
    with sched:
        assert "data" in torch.Tensor.__dict__
        t.data = torch.ones(2)  # nothing pending: no flush
        assert torch.equal(t.data, torch.ones(2))
    t.data = torch.zeros(2)  # outside: the hook, still in for a while, flushes nothing
    assert not sched.stats.flushes["data"]
    hooks_taken_out()
    assert "data" not in torch.Tensor.__dict__
    assert torch.Tensor.data.__get__(t, torch.Tensor) is not t  # PyTorch's own again


def test_dlpack_and_the_array_interface_see_the_pending_values(sched: TorchScheduler) -> None:
    hooks_taken_out()
    x = torch.tensor([0.25, -1.0])
    dlpack, interface = torch.Tensor.__dlpack__, torch.Tensor.__dict__["__cuda_array_interface__"]
    from_data = torch.tensor
    with torch.no_grad(), sched:
        y = x * 4 + 1
        assert np.from_dlpack(y).tolist() == [2.0, -3.0]  # torch's __dlpack__ flushes first
        z = y * 2
        # A CPU tensor has no array interface (PyTorch raises AttributeError): asking
        # for it still flushes what the tensor may read.
        assert getattr(z, "__cuda_array_interface__", None) is None
        assert sched.stats.flushes == {"dlpack": 1, "array interface": 1}
        assert torch.Tensor.__dlpack__ is not dlpack
    hooks_taken_out()
    assert torch.Tensor.__dlpack__ is dlpack  # PyTorch's own again
    assert torch.Tensor.__dict__["__cuda_array_interface__"] is interface
    assert torch.tensor is from_data


def test_cpu_reads_and_kept_storage_see_the_pending_values(sched: TorchScheduler) -> None:
    # On the CPU these read memory with no op; on CUDA each is a copy (an op) anyway.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def saved(t: Any) -> Any:
        buffer = io.BytesIO()
        torch.save(t, buffer)  # through untyped_storage()
        buffer.seek(0)
        return torch.load(buffer)

    def storage_outlives_tensor() -> Any:
        y = x * 2
        storage = y.untyped_storage()
        del y
        _later = [x * 3, x * 4, x * 5]  # results of y's shape: none may take its memory
        return torch.empty(0).set_(storage).clone()

    with torch.no_grad(), sched:
        assert (x * 2).tolist() == [2.0, 4.0, 6.0, 8.0]
        assert (x * 3).numpy().tolist() == [3.0, 6.0, 9.0, 12.0]
        assert np.asarray(x * 4).tolist() == [4.0, 8.0, 12.0, 16.0]
        assert pickle.loads(pickle.dumps(x * 5)).tolist() == [5.0, 10.0, 15.0, 20.0]
        assert saved(x * 6).tolist() == [6.0, 12.0, 18.0, 24.0]
        assert storage_outlives_tensor().tolist() == [2.0, 4.0, 6.0, 8.0]
    assert set(sched.stats.flushes) >= {"tolist", "numpy", "storage"}


def test_a_reused_result_carries_nothing_of_the_dead_one(sched: TorchScheduler) -> None:
    # A result nobody holds any more is handed out again as a later result of its
    # shape: not if its holder made it need autograd, or inference mode made it.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    with torch.no_grad(), sched:
        with torch.inference_mode():
            inside = torch.sigmoid(x * 2)
        outside = x * 3
        outside.add_(1)  # an inference tensor would refuse this outside the mode
        a = x * 2
        a.requires_grad_()
        del a
        later = [x + 1, x * 3]
    assert inside.is_inference() and not outside.is_inference()
    assert not any(t.requires_grad for t in later)
    torch.testing.assert_close(outside, x * 3 + 1)


def test_results_are_laid_out_as_eager_lays_them_out(sched: TorchScheduler) -> None:
    # Strides matter to what comes after (view, is_contiguous): PyTorch's elementwise
    # results follow all their operands' layout, where's condition first.
    xt, c, row, wide, column = rand(3, 4).t(), rand(4, 3), rand(3), rand(8, 6), rand(4, 1)
    cond = rand(4, 3) > 0
    every = {
        "transposed, scalar": lambda: xt * 2,
        "scalar first (rsub)": lambda: 1 - xt,
        "0-dim first": lambda: torch.tensor(2.0) * xt,
        "broadcast row first": lambda: row * xt,
        "contiguous first": lambda: c + xt,
        "transposed first": lambda: xt + c,
        "where": lambda: torch.where(cond, xt, c),
        "where, transposed condition": lambda: torch.where(cond.t().contiguous().t(), c, xt),
        "clamp by tensors": lambda: torch.clamp(xt, c, c + 1),
        "unary": lambda: torch.sigmoid(xt),
        "cast": lambda: xt.half(),
        "clone": lambda: xt.clone(),
        "contiguous clone": lambda: xt.clone(memory_format=torch.contiguous_format),
        "a scalar base": lambda: 2**xt,
        "sliced": lambda: wide[::2, ::2] * 3,
        "expanded": lambda: column.expand(4, 3) + xt,
    }
    for what, op in every.items():
        with torch.no_grad():
            expected = op()
            with sched:
                got = op()
        assert got.stride() == expected.stride(), what
        torch.testing.assert_close(got, expected, msg=what)


def test_a_reused_result_has_the_layout_a_new_one_would(sched: TorchScheduler) -> None:
    xt, c = rand(3, 4).t(), rand(4, 3)
    with torch.no_grad(), sched:
        a = c * 2
        _k = c + 1
        del a  # a contiguous result of xt's shape nobody holds
        got = xt * 2
    assert got.stride() == (xt * 2).stride() == (1, 4)


def test_a_write_through_numpy_to_memory_a_view_reads_flushes_first(
    sched: TorchScheduler,
) -> None:
    x = torch.zeros(8)
    view = x[2:]  # made before the batch: the batch reads x's memory through it
    with torch.no_grad(), sched:
        y = view + 1
        x.numpy()[2] = 100.0
    assert y[0].item() == 1.0 and sched.stats.flushes["numpy"] == 1


def test_a_hook_waits_for_a_flush_in_progress_of_a_batch_it_touches() -> None:
    # Another thread's flush (the timer's) has swapped its batch out before it runs it:
    # a read of that batch's result must still wait until it has run.
    release, running = threading.Event(), threading.Event()

    class Slow(KeepsPrograms):
        def run(self, words: Any, n: int, units: int, stream: Any) -> None:
            running.set()
            assert release.wait(5)
            super().run(words, n, units, stream)

    scheduler = TorchScheduler(Slow(), auto_flush_ms=None)
    x = torch.tensor([1.0, 2.0])
    with torch.no_grad(), scheduler:
        y = x * 3
        flusher = threading.Thread(target=scheduler.flush)
        flusher.start()
        assert running.wait(5)
        threading.Timer(0.2, release.set).start()
        assert y.tolist() == [3.0, 6.0]  # waits for the flush, which runs the batch
    flusher.join()
    scheduler.close()


def test_the_hooks_wait_for_no_flush_of_a_batch_they_do_not_touch() -> None:
    # A flush holds the scheduler's lock while its executor runs, which on an engine
    # waits for another thread's event loop; that loop may print or list any tensor.
    unrelated = torch.arange(3.0)
    finished = threading.Event()

    class WaitsForAnotherThread(KeepsPrograms):
        def run(self, words: Any, n: int, units: int, stream: Any) -> None:
            other = threading.Thread(target=lambda: (unrelated.tolist(), finished.set()))
            other.start()
            assert finished.wait(5), "the other thread blocked in a Tensor hook"
            super().run(words, n, units, stream)

    scheduler = TorchScheduler(WaitsForAnotherThread(), auto_flush_ms=None)
    with torch.no_grad(), scheduler:
        y = torch.ones(4) + 1
    assert y.tolist() == [2.0, 2.0, 2.0, 2.0]
    scheduler.close()


def test_the_hooks_stay_in_between_contexts_and_come_out_once_idle(
    sched: TorchScheduler,
) -> None:
    """Putting the hooks in and out changes ``Tensor`` (emptying its attribute caches):
    contexts entered one after another keep them; LINGER_S after the last, they go."""
    from gpuactors.torch import hooks

    hooks_taken_out()
    original = vars(torch.Tensor)["__repr__"]
    for _ in range(3):
        with torch.no_grad(), sched:
            y = torch.ones(2) * 3
        replacement = vars(torch.Tensor)["__repr__"]
        assert replacement is not original and hooks.HOOKS.installed()
        # Between contexts they do what PyTorch's own would, flushing nothing.
        assert repr(y) == "tensor([3., 3.])" and y.tolist() == [3.0, 3.0]
    assert sum(sched.stats.flushes.values()) == sched.stats.flushes["exit"] == 3
    hooks_taken_out()
    assert vars(torch.Tensor)["__repr__"] is original
    assert "numpy" not in vars(torch.Tensor) and torch.tensor is hooks._PYTORCH[torch, "tensor"]


@pytest.mark.parametrize("chains", [False, True], ids=["replaces", "calls the hook back"])
def test_a_patch_made_while_the_hooks_linger_is_wrapped_and_then_kept(
    sched: TorchScheduler, chains: bool
) -> None:
    """A library patching ``Tensor.__repr__`` between contexts (lovely-tensors does) goes
    under the hooks at the next context, and stays once they are out. One that keeps the
    hook it replaced and calls it back does not loop."""
    hooks_taken_out()
    pytorch_repr = torch.Tensor.__repr__
    with torch.no_grad(), sched:
        torch.ones(2) + 1
    replaced = torch.Tensor.__repr__

    def patched(self: Any, *, tensor_contents: Any = None) -> str:
        if chains:
            return "my" + replaced(self, tensor_contents=tensor_contents)
        return "my" + torch._tensor_str._str(self, tensor_contents=tensor_contents)

    torch.Tensor.__repr__ = patched  # type: ignore[method-assign,assignment]
    try:
        with torch.no_grad(), sched:
            pending = torch.full((4,), 7.0) * 3
            shown = repr(pending)  # flushes first
        assert shown == "mytensor([21., 21., 21., 21.])"
        hooks_taken_out()
        assert vars(torch.Tensor)["__repr__"] is patched
        assert repr(torch.ones(1)) == "mytensor([1.])"
    finally:
        torch.Tensor.__repr__ = pytorch_repr  # type: ignore[method-assign]


def test_a_forked_child_takes_out_the_hooks_the_parent_left_in() -> None:
    """The child has no thread of its parent's, the one that takes the hooks out too."""
    code = (
        "import os, time, sys\n"
        f"sys.path[:0] = {sys.path!r}\n"
        "import torch\n"
        "from gpuactors.torch import TorchScheduler, ReferenceExecutor\n"
        "from gpuactors.torch.hooks import HOOKS\n"
        "s = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)\n"
        "with s: pass\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    deadline = time.monotonic() + 30\n"  # LINGER_S is 0.1 s
        "    while HOOKS.installed() and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    os._exit(0 if not HOOKS.installed() and 'numpy' not in vars(torch.Tensor) else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == 0


def test_tensors_built_from_lists_of_pending_results(sched: TorchScheduler) -> None:
    # PyTorch reads each tensor of a list in C++, with dispatch modes set aside.
    x = rand(4, 3)
    means = torch.sigmoid(x * 2).mean(-1)
    with torch.no_grad(), sched:
        pending = torch.sigmoid(x * 2).mean(-1)
        losses = torch.tensor([(pending * 2).sum(-1), pending.amax(-1)])
        pair = torch.as_tensor([pending[0], pending[1]])
        nested = torch.asarray([[pending[2]], [pending[3]]])
        new = x.new_tensor([pending[1], 0.5])
    torch.testing.assert_close(losses, torch.stack([(means * 2).sum(-1), means.amax(-1)]))
    torch.testing.assert_close(pair, means[:2])
    torch.testing.assert_close(nested, means[2:].reshape(2, 1))
    torch.testing.assert_close(new, torch.stack([means[1], torch.tensor(0.5)]))
    assert sched.stats.flushes["tensor from data"] >= 1


def test_two_schedulers_on_one_thread_keep_eager_order() -> None:
    first, second = (TorchScheduler(KeepsPrograms(), auto_flush_ms=None) for _ in range(2))
    x, zeros = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.zeros(2, 4)
    y = x.clone()
    traced = trace(lambda t: torch.sigmoid(t) * 2, second)
    with torch.no_grad():
        for _ in range(2):  # recorded, then bound
            traced(rand(4))
        with first:
            read = y * 2
            with second:
                y.add_(100)  # after `read`, as eager orders it
                pending = x * 3
            from_both = pending + zeros  # `first` reads `second`'s result
            moved = x * 2
            replayed = traced(moved)  # `second`'s program reads `first`'s result
    torch.testing.assert_close(read, x * 2)
    torch.testing.assert_close(y, x + 100)
    torch.testing.assert_close(from_both, x * 3 + zeros)
    torch.testing.assert_close(replayed, torch.sigmoid(x * 2) * 2)
    assert first.stats.flushes["other scheduler"] >= 1
    first.close()
    second.close()


def test_integer_and_bool_arithmetic_go_to_pytorch(sched: TorchScheduler) -> None:
    check(sched, lambda i: (torch.relu(i), i * 2, i.float() + 1), torch.arange(-3, 4), taken=False)
    check(sched, lambda m: m * 2.0, torch.tensor([True, False]), taken=False)
    check(sched, lambda d: torch.exp(d), torch.tensor([0.5, 1.0], dtype=torch.float64), taken=False)
    assert sched.stats.declined == 5  # relu, mul and the cast of int64, the bool mul, exp


def test_autograd_inputs_go_to_pytorch_when_grad_is_on(sched: TorchScheduler) -> None:
    w = torch.ones(3, requires_grad=True)
    with sched:
        y = torch.sigmoid(w * 2)
    assert y.grad_fn is not None and sched.stats.ops == 0
    y.sum().backward()
    assert w.grad is not None
    with torch.no_grad(), sched:
        z = torch.sigmoid(w * 2)
    assert sched.stats.ops == 2 and z.grad_fn is None
    torch.testing.assert_close(z, y.detach())


def test_tensors_above_the_size_threshold_go_to_pytorch() -> None:
    sched = TorchScheduler(ReferenceExecutor(), size_threshold=100, auto_flush_ms=None)
    x, big, row, col = rand(10), rand(101), rand(1, 20), rand(20, 1)
    with torch.no_grad(), sched:
        small = x * 2
        large = big * 2
        outer = row + col  # inputs under the limit, the broadcast result over it
    assert sched.stats.ops == 1 and sched.stats.declined == 2
    torch.testing.assert_close(small, x * 2)
    torch.testing.assert_close(large, big * 2)
    torch.testing.assert_close(outer, row + col)


def test_tensors_on_another_device_are_declined() -> None:
    cuda_batch = Batch(torch.device("cuda", 0), 1 << 10)
    with pytest.raises(Decline):
        cuda_batch.check(torch.ones(3))  # a CPU tensor for a CUDA engine
    sched = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    with torch.no_grad(), sched:
        out = torch.ones(3, device="meta") * 2  # another device: PyTorch runs it
    assert out.device.type == "meta" and sched.stats.ops == 0


def test_empty_tensors_and_other_dims_go_to_pytorch(sched: TorchScheduler) -> None:
    empty, x = torch.ones(0, 3), rand(3, 4)
    with torch.no_grad(), sched:
        e = empty * 2
        s = x.sum(dim=0)  # not the last dim
        m = x.max(-1).values  # max with indices: not in the table
        d = x.sum(-1, dtype=torch.float16)  # a dtype argument
    assert e.shape == (0, 3) and m.shape == (3,)
    torch.testing.assert_close(s, x.sum(dim=0))
    torch.testing.assert_close(d, x.sum(-1, dtype=torch.float16))
    assert sched.stats.ops == 0 and sched.stats.declined == 3


# ------------------------------------------------------------ when it flushes
def test_flush_reasons() -> None:
    sched = TorchScheduler(ReferenceExecutor(), max_batch_ops=3, auto_flush_ms=None)
    x = rand(8)
    with torch.no_grad(), sched:
        y = x
        for _ in range(7):
            y = y * 1.5
        sched.flush()
        z = y + 1
    assert sched.stats.flushes["size"] == 2 and sched.stats.flushes["explicit"] == 1
    assert sched.stats.flushes["exit"] == 1
    torch.testing.assert_close(z, x * 1.5**7 + 1)


def test_a_full_program_is_flushed_and_the_op_retried() -> None:
    sched = TorchScheduler(ReferenceExecutor(), max_batch_ops=10_000, auto_flush_ms=None)
    x = rand(8)
    keep = []
    with torch.no_grad(), sched:
        y = x
        for _ in range(700):
            y = y + 0.001
            keep.append(y)  # every result stays alive: every store is kept
    assert sched.stats.flushes["full"] >= 1
    torch.testing.assert_close(keep[-1], x + 0.7, rtol=1e-4, atol=1e-4)


def test_the_timer_flushes_a_batch_left_alone() -> None:
    sched = TorchScheduler(ReferenceExecutor(), auto_flush_ms=5.0)
    try:
        with torch.no_grad(), sched:
            y = rand(4) * 0 + 7
            deadline = time.monotonic() + 10
            while not sched.stats.flushes["timer"] and time.monotonic() < deadline:
                time.sleep(0.005)
            assert sched.stats.flushes["timer"] == 1
            assert torch.equal(y, torch.full((4,), 7.0))  # already there: no flush needed
        assert sched.stats.flushes["exit"] == 0
    finally:
        sched.close()


async def test_flush_async_does_not_block_the_loop() -> None:
    sched = TorchScheduler(ReferenceExecutor(), auto_flush_ms=None)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    def record() -> Any:
        sched.__enter__()
        return rand(5) * 3

    ticking = asyncio.get_running_loop().create_task(ticker())
    loop = asyncio.get_running_loop()
    with torch.no_grad(), concurrent.futures.ThreadPoolExecutor(1) as worker:
        y = await loop.run_in_executor(worker, record)  # a context left open there
        await sched.flush_async()
        ticking.cancel()
        await loop.run_in_executor(worker, sched.__exit__, None, None, None)
    assert sched.stats.flushes["async"] == 1 and ticks > 0
    assert y.shape == (5,)


def test_dead_intermediates_are_not_stored(sched: TorchScheduler) -> None:
    x, y = rand(64), rand(64)

    def chain(x: Any, y: Any) -> Any:
        for _ in range(4):
            x = torch.tanh(torch.relu(x + y) * 1.5)
        return x.sum(-1)

    with torch.no_grad(), sched:
        out = chain(x, y)
    (program,) = sched.executor.programs
    stores = _count_stores(program)
    assert stores == 1  # only the value the sum reads: 12 results died unread
    torch.testing.assert_close(out, chain(x, y))


def _count_stores(words: np.ndarray) -> int:
    count, pos = 0, P.HEADER_WORDS
    for _ in range(int(words[2])):
        head, length = int(words[pos]), int(words[pos + 1])
        if head & 0xFF == P.STAGE_POINTWISE:
            rank = (head >> 8) & 0xFF
            pc, end = pos + 4 + rank, pos + length
            while pc < end:
                w0 = int(words[pc])
                op = w0 & 0xFF
                if op == P.OP_SKIP:
                    pc += w0 >> 8
                elif op in (P.OP_LOAD, P.OP_STORE):
                    count += op == P.OP_STORE
                    strided = (w0 >> 24) & 0xF == P.MODE_STRIDED
                    pc += 3 + (2 * (w0 >> 28) if strided else 0)
                else:
                    pc += P.ALU_WORDS
        pos += length
    return count


def test_nesting_and_one_thread_at_a_time(sched: TorchScheduler) -> None:
    with torch.no_grad(), sched:
        with sched:
            y = rand(3) + 1
        assert sched.stats.flushes["exit"] == 0  # the inner exit does not flush
        errors: list[BaseException] = []

        def other() -> None:
            try:
                sched.__enter__()
            except InvalidArgument as exc:
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(errors) == 1
    assert sched.stats.flushes["exit"] == 1 and y.shape == (3,)


def test_a_result_a_view_was_taken_of_keeps_its_memory_until_its_store_ran() -> None:
    # A view makes the result's store required; were the batch not to hold the result,
    # its memory would go back to the allocator while the store is still to run.
    # (No replay: its function mode would hand the probe below the context's flushing
    # untyped_storage.)
    sched = TorchScheduler(KeepsPrograms(), auto_flush_ms=None, replay=False)
    x, w = torch.arange(64, dtype=torch.float32), torch.ones(8)
    with torch.no_grad(), sched:
        y = x * 2
        v = y[:8]
        u = w + 1
        # PyTorch's own untyped_storage (the context's would flush): its weak reference
        # is alive while any tensor uses the memory.
        memory = weakref.ref(torch.Tensor.__base__.untyped_storage(y))
        del y, v
        gc.collect()
        assert memory() is not None
        zeros = [torch.zeros(64) for _ in range(20)]  # one may get freed memory
    assert all(bool((z == 0).all()) for z in zeros)
    torch.testing.assert_close(u, w + 1)


def test_what_eager_refuses_or_fills_with_nan_is_left_to_pytorch(sched: TorchScheduler) -> None:
    x, y = rand(2, 3), rand(2, 3)
    refused = [
        lambda: x - True,
        lambda: True - x,
        lambda: torch.add(x, y, alpha=True),
        lambda: torch.sub(x, y, alpha=True),
    ]
    with torch.no_grad():
        for call in refused:
            with pytest.raises(RuntimeError):
                call()
            with sched, pytest.raises(RuntimeError):
                call()
        nan = float("nan")
        for low, high in ((nan, 1.0), (0.0, nan), (nan, nan)):
            with sched:
                got = x.clamp(low, high)
            torch.testing.assert_close(got, x.clamp(low, high), equal_nan=True)


# -------------------------------------------------------------- traced mode


def test_traced_mode_replays_on_twenty_shapes(sched: TorchScheduler) -> None:
    traced = trace(chain57, sched)
    with torch.no_grad():
        for k in range(20):
            n = 1000 + 37 * k
            x, y = rand(n), rand(n)
            torch.testing.assert_close(traced(x, y), chain57(x, y), rtol=1e-4, atol=1e-4)
    assert traced.recordings == 1 and traced.replays == 19


def test_traced_mode_rerecords_when_the_structure_changes(sched: TorchScheduler) -> None:
    def norm(x: Any, b: Any) -> Any:
        c = x - x.mean(-1, keepdim=True)
        return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5) + b, c.amax(-1)

    traced = trace(norm, sched)
    with torch.no_grad():
        for shape in [(3, 8), (5, 16), (2, 3, 8), (4, 1, 7), (6, 10)]:
            for dtype in (torch.float32, torch.float16):
                x, b = rand(*shape, dtype=dtype), rand(shape[-1], dtype=dtype)
                assert_same(list(traced(x, b)), list(norm(x, b)), f"{shape} {dtype}")
    # (rank 2, f32), (rank 2, f16), (rank 3 ...), and the size-1 dim makes a new signature
    assert traced.recordings == 6 and traced.replays == 4


def test_traced_mode_records_per_shape_what_reads_sizes(sched: TorchScheduler) -> None:
    # A number computed from a size (attention's d ** -0.5, a mean by hand) is part of
    # the program: replayed at another size it would be the recorded one.
    def scaled(x: Any) -> Any:
        return x * x.shape[-1] ** -0.5

    def by_hand(x: Any) -> Any:
        return x.sum(-1) / x.size(-1) + len(x)

    def by_bytes(x: Any) -> Any:
        return x * (4.0 / x.nbytes)

    for fn in (scaled, by_hand, by_bytes):
        traced = trace(fn, sched)
        with torch.no_grad():
            for width in (16, 64, 16, 64, 32):
                x = rand(3, width)
                torch.testing.assert_close(traced(x), fn(x), msg=f"{fn.__name__} {width}")
        assert traced.recordings == 3 and traced.replays == 2, fn.__name__


def test_traced_mode_takes_keyword_arguments(sched: TorchScheduler) -> None:
    def scaled(x: Any, y: Any, scale: float = 2.0) -> Any:
        return x * scale + y

    def by_keyword_only(x: Any, *, scale: float) -> Any:
        return x * scale

    traced, keyword_only = trace(scaled, sched), trace(by_keyword_only, sched)
    x, y = rand(5), rand(5)
    with torch.no_grad():
        for scale in (3.0, 3.0, 0.5):
            torch.testing.assert_close(traced(x, y=y, scale=scale), scaled(x, y, scale))
            torch.testing.assert_close(keyword_only(x, scale=scale), x * scale)
        with pytest.raises(TypeError):  # as the function itself refuses it
            traced(x, y, bad=1)
    assert traced.recordings == 2 and traced.replays == 1  # one per scale
    assert keyword_only.recordings == 0  # run under the scheduler each time

    class Scaled(torch.nn.Module):
        def forward(self, x: Any, scale: float = 2.0) -> Any:
            return x * scale

    module = trace(Scaled(), sched)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(module(x, scale=3.0), x * 3.0)
    assert module.recordings == 1 and module.replays == 2


def test_traced_results_follow_the_inputs_dim_order(sched: TorchScheduler) -> None:
    traced = trace(lambda t: torch.sigmoid(t) * 2, sched)
    with torch.no_grad():
        for t in (rand(6, 8)[:4, :3], rand(3, 4).t(), rand(8, 6)[:4, :3]):
            got, expected = traced(t), torch.sigmoid(t) * 2
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got, expected)


def test_traced_mode_records_again_when_a_constant_starts_needing_autograd(
    sched: TorchScheduler,
) -> None:
    scale = torch.nn.Parameter(rand(4, 3), requires_grad=False)  # a frozen layer
    traced = trace(lambda t: torch.tanh(t * scale) + 1, sched)
    x = rand(4, 3)
    for _ in range(2):
        traced(x)  # recorded, then replayed
    scale.requires_grad_(True)  # unfrozen
    traced(x).sum().backward()
    expected = (1 - torch.tanh(x * scale.detach()) ** 2) * x
    assert scale.grad is not None
    torch.testing.assert_close(scale.grad, expected)


def test_traced_mode_keeps_in_place_updates_and_constants(sched: TorchScheduler) -> None:
    scale = rand(5)

    def step(x: Any, m: Any) -> Any:
        m.mul_(0.9).add_(x, alpha=0.1)  # an in-place update of an argument
        return x * scale + m

    traced = trace(step, sched)
    with torch.no_grad():
        for rows in (2, 3, 4):
            x, m = rand(rows, 5), rand(rows, 5)
            m_eager = m.clone()
            got = traced(x, m)
            expected = step(x, m_eager)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(m, m_eager)
    assert traced.recordings == 1 and traced.replays == 2
    # A size the constant fixes cannot change: the call runs as recorded (and fails
    # as eager PyTorch does) instead of replaying a program that no longer fits.
    with torch.no_grad(), pytest.raises(RuntimeError):
        traced(rand(2, 6), rand(2, 6))


def test_a_hot_loop_replays_one_bound_plan_on_new_tensors(sched: TorchScheduler) -> None:
    def step(x: Any, m: Any) -> Any:
        m.mul_(0.9).add_(x, alpha=0.1)
        return (x * m).relu().sum(-1), x + 1

    traced = trace(step, sched)
    kept = []
    with torch.no_grad():
        for _ in range(5):
            x, m = rand(3, 7), rand(3, 7)
            m_eager = m.clone()
            got = traced(x, m)
            expected = step(x, m_eager)
            assert_same(list(got), list(expected), "same shapes, new tensors")
            torch.testing.assert_close(m, m_eager)
            kept.append((got, expected))
    # Every call's results are its own: no later call wrote into them.
    for got, expected in kept:
        assert_same(list(got), list(expected), "kept results")
    assert traced.recordings == 1 and traced.bindings == 1 and traced.replays == 4


def test_a_bound_plan_keeps_one_scratch_per_stream(sched: TorchScheduler) -> None:
    # The sum reads what the pointwise stage wrote: a result no call returns, which a
    # stream's calls share (off CUDA there is one "stream", None).
    def fn(x: Any, y: Any) -> Any:
        return (x * y).relu().sum(-1)

    traced = trace(fn, sched)
    with torch.no_grad():
        for _ in range(4):
            x, y = rand(5, 9), rand(5, 9)
            torch.testing.assert_close(traced(x, y), fn(x, y))
    (bound,) = traced._bound.values()
    assert list(traced._scratch_kept) == [(bound.serial, None)]
    assert len(traced._scratch_kept[bound.serial, None]) == 1
    assert len(bound.allocations) == 1  # the sum, new for every call


class _Stream:
    """What scratch is kept by: a stream's handle."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


def bound_with_scratch(sched: TorchScheduler) -> tuple[Any, Any]:
    """A traced function with a reduction (so scratch) and its one binding."""
    traced = trace(lambda x: (x * 2).sum(-1), sched)
    with torch.no_grad():
        x = rand(3, 4)
        traced(x)  # recorded
        traced(x)  # bound
    (bound,) = traced._bound.values()
    return traced, bound


def test_a_traced_function_keeps_a_bounded_number_of_scratch_sets(
    sched: TorchScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules["gpuactors.torch.traced"], "MAX_SCRATCH", 2)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    traced, bound = bound_with_scratch(sched)
    for handle in (7, 8, 7, 9):
        traced._scratch(bound, _Stream(handle))
    # None, then 7, were dropped; 7 was taken again and dropped again
    assert list(traced._scratch_kept) == [(bound.serial, 8), (bound.serial, 9)]


def test_a_call_captured_in_a_cuda_graph_gets_scratch_of_its_own(
    sched: TorchScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    traced, bound = bound_with_scratch(sched)
    kept = dict(traced._scratch_kept)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    first, second = traced._scratch(bound, _Stream(7)), traced._scratch(bound, _Stream(7))
    assert first[0] is not second[0]  # fresh each time: none is kept for a graph
    assert traced._scratch_kept == kept


def test_a_traced_call_reads_a_constant_where_its_memory_is_now(sched: TorchScheduler) -> None:
    # ``p.data = ...`` (as module.to() or .half() do) moves a tensor the function
    # reaches without taking it as an argument: a bound plan must not keep its old
    # address.
    c = torch.ones(6)

    def fn(x: Any) -> Any:
        return x * c + 1

    traced = trace(fn, sched)
    with torch.no_grad():
        x = rand(6)
        for _ in range(3):
            torch.testing.assert_close(traced(x), fn(x))
        c.data = torch.full((6,), 2.0)
        torch.testing.assert_close(traced(x), x * 2 + 1)
    assert traced.recordings == 1 and traced.bindings == 1


def test_one_tensor_passed_twice_is_not_two_tensors(sched: TorchScheduler) -> None:
    def fn(x: Any, y: Any) -> Any:
        return x - y * 2

    traced = trace(fn, sched)
    with torch.no_grad():
        x, a, b = rand(3), rand(3), rand(3)
        torch.testing.assert_close(traced(x, x), fn(x, x))
        torch.testing.assert_close(traced(a, b), fn(a, b))
        torch.testing.assert_close(traced(b, b), fn(b, b))
        torch.testing.assert_close(traced(b, a), fn(b, a))
    assert traced.recordings == 2


def test_an_in_place_update_of_an_argument_another_argument_views_runs_as_eager(
    sched: TorchScheduler,
) -> None:
    # Recorded with two tensors apart, the program reuses y's loaded value after x's
    # store; where y views x's memory, eager PyTorch sees the store.
    def fn(x: Any, y: Any) -> Any:
        z = y * 2
        x.mul_(3)
        return z + y

    traced = trace(fn, sched)
    with torch.no_grad():
        a, b = rand(4), rand(4)
        a_eager = a.clone()
        torch.testing.assert_close(traced(a, b), fn(a_eager, b))
        torch.testing.assert_close(a, a_eager)
        for view in (lambda t: t[0:4], lambda t: t[1:5]):  # the same elements, or shifted
            base = rand(5)
            base_eager = base.clone()
            got = traced(base[0:4], view(base))
            torch.testing.assert_close(got, fn(base_eager[0:4], view(base_eager)))
            torch.testing.assert_close(base, base_eager)
        replays = traced.replays
        torch.testing.assert_close(traced(a, b), fn(a.clone(), b))  # apart: replayed
    assert traced.recordings == 1 and traced.replays == replays + 1


def test_arguments_that_share_memory_replay_where_nothing_is_written(
    sched: TorchScheduler,
) -> None:
    traced = trace(lambda x, y: (x + y).relu(), sched)
    with torch.no_grad():
        traced(rand(4), rand(4))
        base = rand(5)
        torch.testing.assert_close(traced(base[0:4], base[1:5]), (base[0:4] + base[1:5]).relu())
    assert traced.recordings == 1 and traced.replays == 1


def test_a_traced_function_records_again_when_a_constant_changes_layout(
    sched: TorchScheduler,
) -> None:
    # module.half() and p.data = ... give a parameter new memory of another dtype or
    # strides: a plan recorded for the old layout would read it wrongly.
    p = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def fn(x: Any) -> Any:
        return x + p

    traced = trace(fn, sched)
    with torch.no_grad():
        x = rand(4)
        for _ in range(2):
            torch.testing.assert_close(traced(x), fn(x))
        p.data = p.data.half()
        torch.testing.assert_close(traced(x), fn(x))
        p.data = torch.arange(8.0)[::2]
        torch.testing.assert_close(traced(x), fn(x))
    assert traced.recordings == 3


def test_an_argument_that_is_a_constant_written_in_place_runs_as_eager(
    sched: TorchScheduler,
) -> None:
    w = torch.tensor([1.0, 2.0, 3.0])

    def fn(x: Any) -> Any:
        a = w + 1
        x.mul_(2)
        return a, w * 3  # eager sees the write when x is w

    traced = trace(fn, sched)
    with torch.no_grad():
        traced(torch.ones(3))  # recorded with x apart from w
        w_eager = w.clone()
        got = traced(w)
        a = w_eager + 1
        w_eager.mul_(2)
        assert_same(list(got), [a, w_eager * 3], "x is w")
        torch.testing.assert_close(w, w_eager)


def test_a_traced_in_place_write_into_an_expanded_argument_raises_as_eager(
    sched: TorchScheduler,
) -> None:
    def fn(x: Any) -> Any:
        return x.add_(1)

    traced = trace(fn, sched)
    with torch.no_grad():
        traced(rand(4, 12)[:, ::2])  # recorded on a view whose elements are apart
        with pytest.raises(RuntimeError, match="more than one element"):
            traced(rand(1, 6).expand(4, 6))


def test_a_traced_call_with_grad_enabled_keeps_a_constant_parameter_in_autograd(
    sched: TorchScheduler,
) -> None:
    p = torch.nn.Parameter(torch.ones(4))
    traced = trace(lambda x: (x * p).sum(-1), sched)
    x = rand(2, 4)
    with torch.no_grad():
        traced(x)
        traced(x)
    out = traced(x)  # grad enabled: not the plan recorded without it
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(p.grad, x.sum(0))


def test_negative_zero_is_not_zero(sched: TorchScheduler) -> None:
    y = torch.tensor([1.0, -1.0, 2.0])
    with torch.no_grad(), sched:
        a, b = y * 0.0, y * -0.0
    torch.testing.assert_close(1 / a, 1 / (y * 0.0))
    torch.testing.assert_close(1 / b, 1 / (y * -0.0))
    traced = trace(lambda x, s: x * s, sched)
    with torch.no_grad():
        torch.testing.assert_close(1 / traced(y, 0.0), 1 / (y * 0.0))
        torch.testing.assert_close(1 / traced(y, -0.0), 1 / (y * -0.0))


def test_a_recording_inside_an_open_context_is_flushed_by_the_timer() -> None:
    scheduler = TorchScheduler(KeepsPrograms(), auto_flush_ms=1.0)
    traced = trace(lambda x: x * 2, scheduler)
    try:
        with torch.no_grad(), scheduler:
            x = rand(6)
            y = traced(x)  # recorded in the outer context's batch, which stays open
            z = y + 1
            deadline = time.monotonic() + 5
            while scheduler.stats.flushes["timer"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert scheduler.stats.flushes["timer"] >= 1
            torch.testing.assert_close(z, x * 2 + 1)
    finally:
        scheduler.close()


def test_equal_shapes_with_other_strides_bind_their_own_plan(sched: TorchScheduler) -> None:
    def fn(x: Any, y: Any) -> Any:
        return torch.sigmoid(x) * y

    traced = trace(fn, sched)
    with torch.no_grad():
        for wide, step in [(12, 2), (18, 3), (12, 2), (6, 1)]:
            x, y = rand(8, wide)[:, ::step], rand(6)
            torch.testing.assert_close(traced(x, y), fn(x, y))
    # strided (8, 6) views of rows of 12 and 18, one plan; a contiguous one, another
    assert traced.recordings == 2 and traced.bindings == 2 and traced.replays == 2


def test_a_traced_function_keeps_a_bounded_number_of_bound_plans(
    sched: TorchScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the package's ``trace`` is the function: the module by its name)
    monkeypatch.setattr(sys.modules["gpuactors.torch.traced"], "MAX_BOUND", 2)
    traced = trace(lambda x: (x * 3).tanh(), sched)
    with torch.no_grad():
        for n in (5, 6, 7, 6, 5, 6):
            x = rand(n)
            torch.testing.assert_close(traced(x), (x * 3).tanh())
    # 5 recorded; 6 and 7 bound; 6 kept; 5 bound (6 dropped); 6 bound again (7 dropped)
    assert traced.recordings == 1 and traced.bindings == 4 and traced.replays == 5


def test_a_slow_recording_is_not_split_by_the_timer() -> None:
    # A first call slower than auto_flush_ms (a cold start, a GC pause) still records
    # one whole program: were the timer to flush it midway, the signature would never
    # replay.
    scheduler = TorchScheduler(KeepsPrograms(), auto_flush_ms=1.0)

    def slow(x: Any) -> Any:
        y = x * 2
        time.sleep(0.02)
        return (y + 1).relu()

    try:
        traced = trace(slow, scheduler)
        with torch.no_grad():
            for _ in range(3):
                x = rand(6)
                torch.testing.assert_close(traced(x), slow(x))
        assert traced.recordings == 1 and traced.replays == 2
        assert scheduler.stats.flushes["timer"] == 0
    finally:
        scheduler.close()


def test_untraceable_functions_still_run_correctly(sched: TorchScheduler) -> None:
    def with_view(x: Any) -> Any:
        return (x.t() * 2).relu()

    traced = trace(with_view, sched)
    with torch.no_grad():
        for shape in [(3, 4), (3, 4), (5, 2)]:
            x = rand(*shape)
            torch.testing.assert_close(traced(x), with_view(x))
    assert traced.replays == 0


def test_importing_gpuactors_never_imports_torch() -> None:
    code = (
        "import sys, gpuactors, gpuactors.torch, gpuactors.torch.program, "
        "gpuactors.torch.kernel\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "gpuactors.torch.PROGRAM_OP\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_first_stage_is_spread_over_units_by_its_size() -> None:
    from gpuactors.torch.batch import ENGINE_SPREAD, STREAM_SPREAD

    for spread in (ENGINE_SPREAD, STREAM_SPREAD):
        each = spread.unit_elements
        assert [spread.pointwise(n) for n in (0, 1, each)] == [1, 1, 1]
        assert spread.pointwise(each + 1) == 2
        assert spread.pointwise(8 * each) == 8
        assert spread.pointwise(10**9) == spread.max_pointwise_units
        rows = spread.unit_rows
        assert [spread.reduction(r) for r in (1, rows, rows + 1)] == [1, 1, 2]
        assert spread.reduction(10**9) == spread.max_reduction_units
    # A launch's blocks cost nothing to claim: the stream spreads further.
    assert STREAM_SPREAD.pointwise(4096) > ENGINE_SPREAD.pointwise(4096)


def test_a_traced_plan_computes_each_patched_value_once() -> None:
    from gpuactors.torch.traced import _patches

    size, ptr = ("size", (0, 0)), ("ptr", "in", 0)
    patches = [(4, size, 0), (8, ptr, 0), (9, ptr, 1), (12, size, 0), (20, ptr, 0), (21, ptr, 1)]
    exprs, positions, word_patches = _patches(patches)
    assert exprs == [size, ptr]
    assert positions.tolist() == [4, 8, 9, 12, 20, 21]
    assert word_patches == [(0, 0), (1, 0), (1, 32), (0, 0), (1, 0), (1, 32)]


# ------------------------------------------------------ where units meet
def test_every_run_gets_the_next_ticket_and_its_own_counter() -> None:
    points = MeetingPoints(torch.device("cpu"), slots=3)
    stamped = []
    for _ in range(4):
        program = np.zeros(8, dtype=np.uint32)
        points.stamp(program)
        stamped.append((int(program[3]), int(program[4]) | int(program[5]) << 32))
    # Tickets 1..4; counters of slots 1, 2, 0, 1: a slot comes back `slots` runs later.
    base = stamped[2][1]
    assert stamped == [(1, base + 8), (2, base + 16), (3, base), (4, base + 8)]
    assert points.runs == 4


def test_a_run_captured_in_a_cuda_graph_gets_a_counter_no_other_run_uses() -> None:
    points = MeetingPoints(torch.device("cpu"), slots=2, graph_slots=2)

    def counter(for_graph: bool = False) -> int:
        program = np.zeros(8, dtype=np.uint32)
        points.stamp(program, for_graph)
        return int(program[4]) | int(program[5]) << 32

    ordinary = {counter() for _ in range(5)}
    captured = [counter(for_graph=True), counter(for_graph=True)]
    ordinary |= {counter() for _ in range(5)}
    assert len(ordinary) == 2 and len(set(captured)) == 2 and not ordinary & set(captured)
    assert points.runs == 12 and points.graph_runs == 2
    with pytest.raises(InvalidArgument, match="CUDA graphs"):
        counter(for_graph=True)
    assert points.runs == 12  # the refused run took no ticket


# ------------------------------------------------------ timer flushes and the user
class _SlowReference(ReferenceExecutor):
    """Stands in for the time between a flush taking the batch and running it."""

    def __init__(self) -> None:
        self.entered = threading.Event()

    def run(self, words: Any, n: int, units: int, stream: Any) -> None:
        self.entered.set()
        time.sleep(0.2)
        super().run(words, n, units, stream)


def test_an_op_during_a_timer_flush_waits_for_the_batch_it_took() -> None:
    executor = _SlowReference()
    sched = TorchScheduler(executor, auto_flush_ms=1.0)
    with torch.no_grad(), sched:
        y = torch.ones(4) * 0 + 7
        assert executor.entered.wait(5)  # the timer has taken the batch, not yet run it
        # An op the scheduler does not take runs after it (a CPU tensor's .tolist()
        # reads memory without an op, so cumsum).
        assert torch.cumsum(y, 0).tolist() == [7.0, 14.0, 21.0, 28.0]
    assert sched.stats.flushes["timer"] == 1
    sched.close()


class _FailsOnce(ReferenceExecutor):
    def __init__(self) -> None:
        self.failed = False

    def run(self, words: Any, n: int, units: int, stream: Any) -> None:
        if not self.failed:
            self.failed = True
            raise TaskFailed("torch_program", 1, 4)
        super().run(words, n, units, stream)


def _poll_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait (up to ``seconds``) for the timer thread to make ``condition`` hold; the
    caller asserts what it needs."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_timer_flush_that_fails_is_raised_by_the_next_flush_and_the_timer_goes_on() -> None:
    sched = TorchScheduler(_FailsOnce(), auto_flush_ms=1.0)
    with torch.no_grad():
        with pytest.raises(TaskFailed), sched:
            torch.ones(4) * 0 + 7
            _poll_until(lambda: sched._timer_error is not None)
        assert sched.stats.flushes["timer"] == 1  # (counted, though it failed)
        with sched:  # the timer still flushes
            z = torch.ones(4) * 0 + 5
            _poll_until(lambda: sched.stats.flushes["timer"] >= 2)
        assert sched.stats.flushes["timer"] == 2 and z.tolist() == [5.0] * 4
    sched.close()


def test_the_flush_that_reports_a_timer_failure_runs_the_open_batch_first() -> None:
    """It raised before running the batch open at that moment, whose ops then waited
    for some later flush."""
    sched = TorchScheduler(_FailsOnce(), auto_flush_ms=300.0)
    with torch.no_grad():
        with pytest.raises(TaskFailed), sched:
            torch.ones(4) * 0 + 7
            _poll_until(lambda: sched._timer_error is not None)
            w = torch.ones(4) * 0 + 3  # a new batch, open when the context exits
        assert w.tolist() == [3.0] * 4 and sched.stats.flushes["exit"] == 1
    sched.close()


def test_max_batch_ops_counts_a_batch_s_first_op_too() -> None:
    sched = TorchScheduler(KeepsPrograms(), auto_flush_ms=None, max_batch_ops=1)
    x = rand(16)
    with torch.no_grad():
        for k in range(5):  # three ops a call, each a batch of its own
            with sched:
                got = torch.relu(x * 2.0) + 1.0
            torch.testing.assert_close(got, torch.relu(x * 2.0) + 1.0, msg=f"call {k}")
    assert sched.stats.batches == sched.stats.ops == 15
    assert sched.stats.flushes["size"] == 15
    sched.close()


def test_a_tensor_whose_negation_is_pending_is_left_to_pytorch(sched: TorchScheduler) -> None:
    """``_neg_view()`` sets a bit PyTorch applies when it reads: the memory holds the
    values unnegated, so a program must not read it. First in a batch, then as the
    input of a replaying loop (the same object, re-pointed with ``.data =``)."""

    def f(a: Any, b: Any) -> Any:
        return torch.tanh(a * b + 0.5) - b

    y, x = rand(8), rand(8)
    negated = rand(8)._neg_view()
    with torch.no_grad():
        with sched:
            got = f(negated, y)
        torch.testing.assert_close(got, f(negated, y))
        for k in range(8):
            if k == 6:
                x.data = rand(8)._neg_view()
            with sched:
                got = f(x, y)
            torch.testing.assert_close(got, f(x, y), msg=f"call {k}")
    assert x.is_neg() and sched.stats.replayed > 0


def test_sparse_and_nested_tensors_are_left_to_pytorch(sched: TorchScheduler) -> None:
    # The program reads strided memory: ops on other layouts run as PyTorch runs them,
    # first in a batch or in a replay that met them where a plan had a strided tensor.
    sparse = (torch.rand(8) - 0.5).relu().to_sparse()
    nested = torch.nested.nested_tensor([torch.rand(8), torch.rand(3)])
    y = rand(8)
    with torch.no_grad():
        for k in range(6):
            t = sparse if k == 4 else nested if k == 5 else rand(8)
            with sched:
                a = y * 3.0
                b = t * 2.0
                c = torch.relu(a) + y.sparse_mask(sparse) if k == 4 else a
            torch.testing.assert_close(a, y * 3.0)
            expected = t * 2.0
            if k == 4:
                torch.testing.assert_close(b.to_dense(), expected.to_dense())
                torch.testing.assert_close(
                    c.to_dense(), (torch.relu(y * 3.0) + y.sparse_mask(sparse)).to_dense()
                )
            elif k == 5:
                for got, want in zip(b.unbind(), expected.unbind(), strict=True):
                    torch.testing.assert_close(got, want)
            else:
                torch.testing.assert_close(b, expected)
    assert sched.stats.replayed >= 1


@pytest.mark.parametrize("period", [0.0, -1.0, float("nan"), float("inf"), 1e300])
def test_a_flush_period_that_no_timer_can_keep_is_refused(period: float) -> None:
    """An infinite period had passed the check, and its timer's thread then died of
    an OverflowError at the first batch."""
    with pytest.raises(InvalidArgument, match="auto_flush_ms must be in"):
        TorchScheduler(ReferenceExecutor(), auto_flush_ms=period)
