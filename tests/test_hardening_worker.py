"""The isolated engine's worker protocol trusts nothing the other process sends, and the
worker's imports do not depend on the folder it starts in.

Each reproducer of the review has its case here: a ``numpy.py`` in the working directory
(``worker_cwd_shadowing.py``); a worker answering with a pickle, garbage, a wrong answer
or a wrong request id, at boot or later (``worker_protocol_trust.py``), driven by the
CPU stand-in worker (``cpu_worker.py``); and the other direction, a parent's pickle
read by a real worker. The decoder is fuzzed: it returns a frame or raises
WorkerProtocolError, nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, EngineConfig, OpSpec
from gpuactors.engine.messages import BatchCompletion, Completion, EnqueueBatch
from gpuactors.errors import DeviceFault, InvalidArgument, NoCudaDevice, WorkerProtocolError
from gpuactors.worker import IsolatedEngine, IsolationConfig, Job, Upload
from gpuactors.worker.codec import MAX_DEPTH
from gpuactors.worker.messages import BootSpec, Download, RemoteArray
from gpuactors.worker.process import WorkerProcess, worker_path
from gpuactors.worker.wire import (
    Answer,
    JobRan,
    Request,
    check_answer,
    decode_frame,
    encode_frame,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# No task deadline: only a prompt failure can end a request that a broken worker holds
# (the watchdog never fires), so a test that passes shows no watchdog wait.
NO_DEADLINE = EngineConfig(default_task_timeout_s=None)


def cpu_isolation() -> IsolationConfig:
    return IsolationConfig(worker_module="cpu_worker", standbys=0, start_timeout_s=30.0)


def op(name: str, body: str = "") -> OpSpec:
    return OpSpec(name=name, params=(ArrayParam(name="out", dtype="float32"),), body=body)


# ------------------------------------------------------ item 10: imports
SHADOWS = ("numpy.py", "json.py", "runpy.py", "cpu_worker.py", "gpuactors/__init__.py")


def plant_shadows(folder: Path) -> Path:
    """Modules that would stand in for the real ones if ``folder`` were on sys.path."""
    marker = folder / "SHADOW_RAN"
    for name in SHADOWS:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(
            f"open({str(marker)!r}, 'a').write({name!r})\nraise SystemExit(3)\n"
        )
    return marker


@pytest.mark.usefixtures("cpu_worker_importable")
@pytest.mark.parametrize("module", ["cpu_worker", "gpuactors.worker"])
async def test_the_working_directory_cannot_shadow_the_workers_imports(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = plant_shadows(tmp_path)
    monkeypatch.chdir(tmp_path)  # e.g. a service started from a user-writable folder
    try:
        worker = await WorkerProcess.spawn(
            BootSpec(), python=sys.executable, module=module, timeout=60
        )
    except NoCudaDevice:  # the real worker, here without a GPU: it imported the real numpy
        assert module == "gpuactors.worker"
    else:
        worker.kill()
        await worker.wait(10)
    assert not marker.exists(), marker.read_text()


def test_the_worker_path_holds_absolute_folders_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["relative/src", "", "/opt/extra"]))
    monkeypatch.setattr(sys, "path", ["", "also/relative", "/srv/app", "/opt/extra"])
    path = worker_path(sys.executable)
    assert path[1:] == ["/opt/extra", "/srv/app"]  # after the package root; no duplicates
    assert Path(path[0], "gpuactors", "worker", "bootstrap.py").is_file()
    # Another interpreter gets this one's package root and PYTHONPATH, not its sys.path.
    assert worker_path("/usr/bin/python3-other") == path[:2]


# -------------------------------------------- item 11: worker -> parent
@pytest.mark.usefixtures("cpu_worker_importable")
@pytest.mark.parametrize(
    "misbehaviour", ["reply_pickle", "reply_garbage", "reply_wrong_answer", "reply_wrong_rid"]
)
async def test_a_broken_answer_fails_what_the_worker_held_at_once(
    misbehaviour: str, tmp_path: Path
) -> None:
    marker = tmp_path / "PICKLE_RAN"
    async with ActorSystem("hardening") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation(), config=NO_DEADLINE)
        slow = asyncio.ensure_future(engine.run("slow", np.zeros(4, np.float32), 1.0, n=4))
        await asyncio.sleep(0.05)  # in the worker when the broken answer comes
        with pytest.raises(WorkerProtocolError):
            await asyncio.wait_for(engine.run(misbehaviour, str(marker), n=0), 60)
        with pytest.raises(WorkerProtocolError):  # held by the same worker: not re-run
            await asyncio.wait_for(slow, 60)
        assert not marker.exists()  # the pickle was never unpickled
        # The worker was replaced as usual, and the next request is served.
        result = await engine.run("fill", np.zeros(4, np.float32), 2.0, n=4)
        np.testing.assert_array_equal(result.arrays[0], np.full(4, 2.0))
        health = await engine.health()
        assert health.restarts == 1 and health.generation == 2 and health.state == "serving"
        await engine.shutdown()


@pytest.mark.usefixtures("cpu_worker_importable")
async def test_a_replacement_worker_gone_at_once_is_replaced_in_turn(tmp_path: Path) -> None:
    """A replacement that exits right after its Ready, seen by a busy parent that reads
    the Ready and the end of the stream together: its loss starts the next replacement,
    which serves (the engine had stayed "serving" with no worker: every request hung)."""
    counter = tmp_path / "boots"
    ops = [op("crash"), op("second_boot_dies", body=str(counter))]
    async with ActorSystem("hardening") as system:
        engine = await IsolatedEngine.start(system, ops=ops, isolation=cpu_isolation())
        y = np.zeros(4, np.float32)
        with pytest.raises(DeviceFault):
            await engine.run("crash", y, n=4)  # the first worker goes: the second boots
        deadline = time.monotonic() + 20.0
        while not (counter.exists() and counter.read_text() == "2"):
            time.sleep(0.02)  # noqa: ASYNC251 (the loop is busy while the worker boots, leaves)
            await asyncio.sleep(0)
            assert time.monotonic() < deadline, "the second worker never booted"
        time.sleep(0.3)  # noqa: ASYNC251 (its Ready and its end wait together in the socket)
        result = await asyncio.wait_for(engine.run("fill", y, 2.0, n=4), 20.0)
        np.testing.assert_array_equal(result.arrays[0], np.full(4, 2.0, np.float32))
        health = await engine.health()
        assert health.state == "serving" and health.pid is not None
        assert counter.read_text() == "3"
        await engine.shutdown()


@pytest.mark.usefixtures("cpu_worker_importable")
@pytest.mark.parametrize("misbehaviour", ["boot_pickle", "boot_garbage", "boot_wrong_answer"])
async def test_a_broken_boot_answer_is_a_typed_error(misbehaviour: str, tmp_path: Path) -> None:
    marker = tmp_path / "PICKLE_RAN"
    async with ActorSystem("hardening") as system:
        with pytest.raises(WorkerProtocolError):
            await IsolatedEngine.start(
                system, ops=[op(misbehaviour, body=str(marker))], isolation=cpu_isolation()
            )
    assert not marker.exists()


# -------------------------------------------- item 11: parent -> worker
def test_the_worker_does_not_unpickle_its_parents_frames(tmp_path: Path) -> None:
    """The real worker module, fed a pickle where its Boot frame belongs, exits unharmed."""
    marker = tmp_path / "PICKLE_RAN"
    ours, theirs = socket.socketpair()
    bootstrap = Path(worker_path(sys.executable)[0], "gpuactors", "worker", "bootstrap.py")
    with ours, theirs:
        path = json.dumps(worker_path(sys.executable))
        child = subprocess.Popen(
            [sys.executable, "-I", str(bootstrap), path, "gpuactors.worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stderr=subprocess.PIPE,
        )
        body = pickle.dumps(("boot", _RunsWhenUnpickled(str(marker))))
        ours.sendall(len(body).to_bytes(4, "big") + body)
        _, stderr = child.communicate(timeout=60)
    assert child.returncode != 0
    assert b"WorkerProtocolError" in stderr
    assert not marker.exists()


class _RunsWhenUnpickled:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (open, (self.marker, "w"))


# ------------------------------------------------------- the decoder itself
def body_of(header: object, segments: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(4, "big") + text + segments


@pytest.mark.parametrize(
    "value",
    [
        {"@": "object", "type": "Popen", "fields": {}},  # not a class the protocol carries
        {"@": "object", "type": "PersistentThreadMode", "fields": {}},  # an enum, not an object
        {"@": "enum", "type": "PersistentThreadMode", "value": "warp-speed"},
        {"@": "error", "type": "SystemExit", "text": "x", "attributes": {}},
        {"@": "error", "type": "DeviceFault", "text": "x", "attributes": {"__class__": 1}},
        {"@": "array", "dtype": "|O8", "shape": [1], "segment": 0},  # objects from memory
        {"@": "array", "dtype": "<f4", "shape": [3], "segment": 0},  # 4 bytes for 12
        {"@": "array", "dtype": "<f4", "shape": [-1], "segment": 0},
        {"@": "scalar", "dtype": "<f8", "hex": "00"},
        {"@": "bytes", "segment": 7},
        {"@": "pickle", "data": "gASV"},
        {"no": "tag"},
        ["a", "tuple", "is", "not", "a", "frame"],
        {"@": "object", "type": "Request", "fields": {"rid": "1", "message": None}},
        {"@": "object", "type": "Ready", "fields": {"pid": 1, "startup_s": 0.0, "extra": 1}},
        {  # a named tuple's fields are checked like a model's
            "@": "object",
            "type": "Completion",
            "fields": {
                "seq": "x",
                "op": "a",
                "version": 1,
                "status": 0,
                "units": 1,
                "device_ns": 1,
            },
        },
    ],
)
def test_malformed_values_are_protocol_errors(value: object) -> None:
    with pytest.raises(WorkerProtocolError):
        decode_frame(body_of({"value": value, "segments": [4]}, b"\0\0\0\0"))


def test_what_cannot_be_sent_is_refused_before_it_is_queued() -> None:
    with pytest.raises(InvalidArgument, match="of type object"):
        encode_frame(Answer(rid=1, value=object()))
    with pytest.raises(InvalidArgument, match="dtype"):
        encode_frame(Answer(rid=1, value=np.array(["text"])))
    with pytest.raises(InvalidArgument, match="keys must be str"):
        encode_frame(Answer(rid=1, value={1: 2}))
    cycle: list[object] = []
    cycle.append(cycle)
    for value in (cycle, 10**5000):  # JSON has no cycles, and no ints of 5000 digits
        with pytest.raises(InvalidArgument, match="cannot be encoded"):
            encode_frame(Answer(rid=1, value=value))


def test_a_value_nested_too_deep_is_refused_far_from_pythons_recursion_limit() -> None:
    """A cycle is refused at a depth of its own, not by a RecursionError (which a
    collection's finalizer, running that deep, would meet too, failing elsewhere)."""

    def nested(levels: int) -> list[object]:
        value: list[object] = [1]
        for _ in range(levels):
            value = [value]
        return value

    shallow = decode_frame(encode_frame(Answer(rid=1, value=nested(90)))[4:])
    assert isinstance(shallow, Answer)
    with pytest.raises(InvalidArgument, match=f"nests deeper than {MAX_DEPTH} levels"):
        encode_frame(Answer(rid=1, value=nested(MAX_DEPTH)))


def test_a_completion_crosses_as_the_same_named_tuple() -> None:
    completion = Completion(seq=3, op="fill", version=2, status=0, units=1, device_ns=5)
    ran = JobRan(completion=completion, arrays=(None,))
    frame = decode_frame(encode_frame(Answer(rid=1, value=ran))[4:])
    assert isinstance(frame, Answer) and isinstance(frame.value, JobRan)
    assert type(frame.value.completion) is Completion and frame.value.completion == completion


def test_an_answer_must_fit_its_request() -> None:
    completion = Completion(seq=1, op="fill", version=1, status=0, units=1, device_ns=1)
    job = Job(op="fill", args=(np.zeros(4, np.float32), 1.0), n=4)
    check_answer(job, JobRan(completion=completion, arrays=(np.ones(4, np.float32), None)))
    remote = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1)
    wrong = [
        (job, JobRan(completion=completion, arrays=(None, None))),  # the array is missing
        (job, JobRan(completion=completion, arrays=(np.ones(5, np.float32), None))),
        (job, JobRan(completion=completion, arrays=(np.ones(4, np.float32),))),
        (job, completion),
        (Upload(array=np.zeros(2)), True),  # a bool is not an array id
        (Download(array=remote), np.zeros(3, np.float32)),
        (Download(array=remote), np.zeros(4, np.float64)),  # another dtype
    ]
    # A batch's answer covers its tasks, which a group joins by position.
    batch = EnqueueBatch(op="fill", args=(remote, 1.0), n=1, count=3, per_task=True)
    statuses = np.zeros(3, np.int32)
    check_answer(batch, BatchCompletion(first_seq=1, count=3, failed=0, statuses=statuses))
    wrong += [
        (batch, BatchCompletion(first_seq=1, count=2, failed=0, statuses=statuses)),
        (batch, BatchCompletion(first_seq=1, count=3, failed=4, statuses=statuses)),
        (batch, BatchCompletion(first_seq=1, count=3, failed=0, statuses=statuses[:2])),
        (batch, BatchCompletion(first_seq=1, count=3, failed=0)),
        # Statuses as an engine writes them: int32 (a group would read 0.5 as "ran"),
        # each failed one counted in ``failed``.
        (batch, BatchCompletion(first_seq=1, count=3, failed=0, statuses=np.zeros(3) + 0.5)),
        (batch, BatchCompletion(first_seq=1, count=3, failed=0, statuses=statuses + 3)),
        (batch, BatchCompletion(first_seq=1, count=3, failed=2, statuses=statuses)),
    ]
    for message, value in wrong:
        with pytest.raises(WorkerProtocolError):
            check_answer(message, value)


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
TAGS = ["dict", "bytes", "complex", "array", "scalar", "error", "enum", "object", "what"]
KEYS = ["@", "items", "segment", "real", "imag", "dtype", "shape", "hex", "type", "text"]
KEYS += ["attributes", "value", "fields", "rid", "message", "error", "pid", "startup_s"]
NAMES = ["Request", "Answer", "Ready", "Job", "Upload", "RemoteArray", "DeviceFault"]
NAMES += ["EngineConfig", "PersistentThreadMode", "<f4", "|b1", "nope"]
JSON_TREES = st.recursive(
    st.one_of(JSON_LEAVES, st.sampled_from(NAMES)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), children, max_size=4),
        st.fixed_dictionaries(
            {"@": st.sampled_from(TAGS)}, optional={k: children for k in KEYS[1:]}
        ),
    ),
    max_leaves=30,
)


def decodes_or_refuses(body: bytes) -> None:
    try:
        frame = decode_frame(body)
    except WorkerProtocolError:
        return
    encode_frame(frame)  # whatever decodes is a frame that can be sent again


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_get_only_the_typed_error(body: bytes) -> None:
    decodes_or_refuses(body)


@FUZZ
@given(JSON_TREES, st.lists(st.integers(min_value=0, max_value=16), max_size=3))
def test_random_trees_get_only_the_typed_error(tree: object, sizes: list[int]) -> None:
    decodes_or_refuses(body_of({"value": tree, "segments": sizes}, bytes(sum(sizes))))


VALID = encode_frame(
    Request(
        rid=7,
        message=Job(op="fill", args=(np.arange(6, dtype=np.float32), np.int32(2), "x"), n=6),
    )
)[4:]


@FUZZ
@given(st.integers(0, len(VALID) - 1), st.integers(0, 255), st.integers(0, len(VALID)))
def test_a_damaged_frame_gets_only_the_typed_error(position: int, byte: int, cut: int) -> None:
    damaged = bytearray(VALID)
    damaged[position] = byte
    decodes_or_refuses(bytes(damaged[:cut] if cut < position else damaged))


VALUES = st.recursive(
    st.one_of(
        JSON_LEAVES.filter(lambda v: v == v),  # NaN != NaN: compared apart
        st.binary(max_size=8),
        st.sampled_from([np.float32(1.5), np.int8(-3), np.bool_(True), np.complex64(1 - 2j)]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=4), children, max_size=3),
    ),
    max_leaves=12,
)


@FUZZ
@given(VALUES)
def test_values_round_trip(value: object) -> None:
    frame = decode_frame(encode_frame(Answer(rid=1, value=value))[4:])
    assert isinstance(frame, Answer)
    assert frame.value == value
    assert repr(frame.value) == repr(value)  # the same types, NumPy scalars included


def test_large_arrays_cross_as_raw_bytes() -> None:
    array = np.random.default_rng(1).standard_normal((1 << 20) + 3)
    frame = encode_frame(Answer(rid=1, value=array[::-1]))
    assert len(frame) < array.nbytes + 200  # no base64, no pickle framing
    decoded = decode_frame(frame[4:])
    assert isinstance(decoded, Answer)
    np.testing.assert_array_equal(decoded.value, array[::-1])
    assert decoded.value.flags.writeable and decoded.value.flags.c_contiguous
