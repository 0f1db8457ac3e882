"""The done word a lone launch spins on: tokens, waits, the fallback when its write
cannot be queued, and faults (no GPU needed: the stream's write is a stand-in)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from gpuactors.cuda import done_word as done_word_module
from gpuactors.cuda.done_word import DoneWord, DoneWordError
from gpuactors.errors import DeviceFault
from gpuactors.nvrtc import launch as launch_module
from gpuactors.nvrtc.launch import CompletionPoller, cuda_error
from gpuactors.nvrtc.messages import Launched


class Stream:
    """A stand-in stream: a write queued on it lands when the test says so."""

    def __init__(self, status: int = 0, lands: bool = True) -> None:
        self.status = status
        self.lands = lands
        self.writes: list[tuple[int, int, int]] = []
        self.word = memoryview(bytearray(4)).cast("I")

    def write(self, stream_ptr: int, address: int, value: int) -> int:
        self.writes.append((stream_ptr, address, value))
        if not self.status and self.lands:
            self.word[0] = value
        return self.status

    def done_word(self) -> DoneWord:
        return DoneWord(self.word, 0x7000, self.write)


def test_each_arm_queues_a_fresh_token_on_its_stream() -> None:
    stream = Stream()
    done = stream.done_word()
    first, second = done.arm(5), done.arm(0)
    assert first is not None and second is not None and second > first
    # stream 0 is the legacy default stream, by its driver handle
    assert stream.writes == [(5, 0x7000, first), (1, 0x7000, second)]
    assert done.wait(second, 1e-3) and not done.wait(first, 1e-4)


def test_no_two_words_share_a_token() -> None:
    """A write still queued from an earlier word (whose memory a new word may reuse)
    never carries a token a later spin waits for."""
    old, new = Stream(lands=False).done_word(), Stream().done_word()
    tokens = [old.arm(1), new.arm(1), old.arm(1), new.arm(1)]
    assert len(set(tokens)) == 4 and None not in tokens


def test_tokens_wrap_around_without_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(done_word_module, "_tokens", lambda: 2**32)
    assert Stream().done_word().arm(5) == 1


def test_a_write_that_never_lands_times_out() -> None:
    done = Stream(lands=False).done_word()
    token = done.arm(5)
    assert token is not None and done.wait(token, 2e-4) is False


def test_a_write_the_driver_cannot_do_turns_the_word_off() -> None:
    done = Stream(status=801).done_word()  # CUDA_ERROR_NOT_SUPPORTED
    assert done.arm(5) is None and done.usable is False


def test_another_refused_write_falls_back_for_that_launch_only() -> None:
    stream = Stream(status=1)  # CUDA_ERROR_INVALID_VALUE (e.g. a capturing stream)
    done = stream.done_word()
    assert done.arm(5) is None and done.usable is True
    stream.status = 0
    assert done.arm(5) is not None


def test_a_write_refused_by_a_faulted_context_is_a_device_fault() -> None:
    done = Stream(status=700).done_word()
    with pytest.raises(DoneWordError) as caught:
        done.arm(5)
    assert caught.value.status == 700
    error = cuda_error(caught.value, "kernel 'k'")
    assert isinstance(error, DeviceFault) and "700" in str(error)


@pytest.fixture
def stream_queries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """CuPy's runtime as the spin sees it: every stream query says done."""
    queried: list[int] = []

    def stream_query(ptr: int) -> int:
        queried.append(ptr)
        return 0

    runtime = types.SimpleNamespace(streamQuery=stream_query, eventQuery=stream_query)
    cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setattr(launch_module, "cupy_module", lambda: types.SimpleNamespace(cuda=cuda))
    return queried


def spin(done: DoneWord | None) -> tuple[Launched | None, CompletionPoller]:
    faults: list[DeviceFault] = []
    poller = CompletionPoller(on_fault=faults.append)
    stream: Any = types.SimpleNamespace(ptr=9)
    return poller.spin_alone(stream, None, "k", "k_sym", done), poller


def test_a_lone_launch_is_answered_from_the_word(stream_queries: list[int]) -> None:
    reply, poller = spin(Stream().done_word())
    assert reply == Launched(name="k", symbol="k_sym") and poller.completed == 1
    assert stream_queries == []  # no stream query


def test_a_lone_launch_still_running_goes_to_the_poller(stream_queries: list[int]) -> None:
    reply, poller = spin(Stream(lands=False).done_word())
    assert reply is None and poller.completed == 0 and stream_queries == []


def test_without_a_usable_word_the_stream_is_queried(stream_queries: list[int]) -> None:
    reply, _ = spin(Stream(status=801).done_word())
    assert reply is not None and stream_queries == [9]
    reply, _ = spin(None)
    assert reply is not None and stream_queries == [9, 9]


def test_a_faulted_context_fails_the_launch_and_marks_the_poller(
    stream_queries: list[int],
) -> None:
    faults: list[DeviceFault] = []
    poller = CompletionPoller(on_fault=faults.append)
    stream: Any = types.SimpleNamespace(ptr=9)
    with pytest.raises(DeviceFault, match="700"):
        poller.spin_alone(stream, None, "k", "k", Stream(status=700).done_word())
    assert poller.fault is faults[0] and poller.completed == 0
