"""Review fixes of the tiny-op scheduler's PyTorch-free parts (the flush timer and the
dtype rules): each test failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from gpuactors.torch import dtypes as D
from test_torch_flush_timer import Scheduler, wait_for


# ------------------------------------------------------------------ flush timer
@pytest.mark.parametrize("coming", [False, True], ids=["open batch", "batches coming"])
def test_stop_ends_a_long_timed_sleep_at_once(coming: bool) -> None:
    """With a long ``auto_flush_ms`` the thread sleeps a whole period (until an open
    batch's deadline, or a period after batches that kept coming): stop() ended none of
    it, so close() waited 5 s for the join, and the thread, with the scheduler it holds,
    lived on to the period's end."""
    s = Scheduler(30.0)
    s.timer.start()
    wait_for(lambda: s.timer._idle)
    s.begin()
    if coming:
        s.flush()  # the timer then sleeps a period, to look again
    time.sleep(0.05)  # the timer's thread is in its sleep
    started = time.monotonic()
    s.timer.stop()
    assert time.monotonic() - started < 1.0
    assert s.timer._thread is not None and not s.timer._thread.is_alive()
    assert s.flushed == []


def test_a_forked_child_gets_a_timer_thread_of_its_own() -> None:
    """A forked child has none of its parent's threads: start() (a context's entry)
    did nothing there, as a thread had been started, so no batch of the child was ever
    flushed by the timer."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path[:0] = {sys.path!r}
        from test_torch_flush_timer import Scheduler, wait_for
        s = Scheduler(0.02)
        s.timer.start()
        wait_for(lambda: s.timer._idle)
        pid = os.fork()
        if pid == 0:
            s.timer.start()  # what the child's next context entry does
            batch = s.begin()
            wait_for(lambda: s.flushed, 3.0)
            os._exit(0 if s.flushed and s.flushed[0][0] is batch else 1)
        _, status = os.waitpid(pid, 0)
        s.timer.stop()
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert done.returncode == 0


# ------------------------------------------------------------------ dtype rules
@pytest.mark.parametrize("dtype", [D.F32, D.F16, D.BF16])
def test_a_scalar_beyond_float32_becomes_infinity_without_a_warning(dtype: int) -> None:
    """``x < 1e39`` or ``torch.where(m, x, -1e300)`` cast the Python scalar to the
    tensor's dtype: NumPy's cast warned ("overflow encountered in cast"), which a
    program run with warnings as errors got as an exception from inside the op."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.scalar_as(1e300, dtype) == np.inf
        assert D.scalar_as(-1e39, dtype) == -np.inf
        assert D.scalar_as(2.0, dtype) == 2.0
