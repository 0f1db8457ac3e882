"""The prompt GIL hand-over used around the engine's module load (no GPU needed)."""

from __future__ import annotations

import sys
import threading

from gpuactors.gil import PROMPT_SWITCH_SECONDS, prompt_handover


def test_the_switch_interval_is_lowered_inside_and_restored_after() -> None:
    before = sys.getswitchinterval()
    with prompt_handover():
        assert sys.getswitchinterval() <= PROMPT_SWITCH_SECONDS
        with prompt_handover():  # nested: one lowering
            assert sys.getswitchinterval() <= PROMPT_SWITCH_SECONDS
        assert sys.getswitchinterval() <= PROMPT_SWITCH_SECONDS
    assert sys.getswitchinterval() == before


def test_an_error_inside_restores_it() -> None:
    before = sys.getswitchinterval()
    try:
        with prompt_handover():
            raise RuntimeError("the load failed")
    except RuntimeError:
        pass
    assert sys.getswitchinterval() == before


def test_a_shorter_interval_already_set_is_kept() -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(PROMPT_SWITCH_SECONDS / 2)
    shorter = sys.getswitchinterval()  # as the interpreter stores it
    try:
        with prompt_handover():
            assert sys.getswitchinterval() == shorter
    finally:
        sys.setswitchinterval(before)


def test_blocks_overlapping_in_threads_restore_the_interval_once() -> None:
    before = sys.getswitchinterval()
    entered = threading.Barrier(2)
    leave = threading.Event()

    def hold() -> None:
        with prompt_handover():
            entered.wait()
            leave.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    leave.set()
    for thread in threads:
        thread.join()
    assert sys.getswitchinterval() == before
