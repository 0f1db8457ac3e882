"""How a lone launch is best seen finished: the same launch (CuPy's driver binding,
prepacked parameters) followed by a spin on ``cudaStreamQuery`` or by a write of a
done word queued behind it (``gpuactors.cuda.done_word``) and a spin on that word,
next to CuPy's launch + synchronize, interleaved in one run.

Run on a GPU machine:  python benchmarks/probe_done_word.py
"""

from __future__ import annotations

import time

import cupy as cp
import numpy as np

from gpuactors.cuda.done_word import device_done_word
from gpuactors.nvrtc.launch import pack_args
from gpuactors.nvrtc.params import ParamBuffer

SOURCE = r"""extern "C" __global__ void axpy(float* y, const float* x, float a,
                                           unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}"""
N = 1024


def main() -> None:
    kernel = cp.RawKernel(SOURCE, "axpy")
    x = cp.random.random(N, dtype=cp.float32)
    y = cp.zeros(N, dtype=cp.float32)
    args = (y, x, np.float32(1.0), np.uint64(N))
    stream = cp.cuda.Stream(non_blocking=True)
    kernel((4,), (256,), args, stream=stream)
    stream.synchronize()
    params = ParamBuffer()
    pack_args(args, (8, 8, 4, 8), 0, "axpy", params)
    launch = cp.cuda.driver.launchKernel
    function, stream_ptr, params_ptr = kernel.kernel.ptr, stream.ptr, params.address
    query = cp.cuda.runtime.streamQuery
    done = device_done_word(cp)
    timed_out = 0

    def cupy_launch_sync() -> None:
        kernel((4,), (256,), args, stream=stream)
        stream.synchronize()

    def stream_query_spin() -> None:
        launch(function, 4, 1, 1, 256, 1, 1, 0, stream_ptr, params_ptr, 0)
        while query(stream_ptr) == 600:  # cudaErrorNotReady
            pass

    def done_word_spin() -> None:
        nonlocal timed_out
        launch(function, 4, 1, 1, 256, 1, 1, 0, stream_ptr, params_ptr, 0)
        token = done.arm(stream_ptr)
        assert token is not None
        if not done.wait(token, 0.01):
            timed_out += 1
            stream.synchronize()

    variants = {
        "CuPy launch + synchronize": cupy_launch_sync,
        "launch + stream query spin": stream_query_spin,
        "launch + done word spin": done_word_spin,
    }
    results: dict[str, list[int]] = {label: [] for label in variants}
    for _ in range(8):  # interleaved rounds
        for label, round_trip in variants.items():
            for index in range(600):
                start = time.perf_counter_ns()
                round_trip()
                if index >= 100:
                    results[label].append(time.perf_counter_ns() - start)
    stream.synchronize()
    base = float(np.median(results["CuPy launch + synchronize"]))
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{name} (timed-out spins: {timed_out})")
    for label, samples in results.items():
        p50 = float(np.median(samples))
        print(
            f"  {label:28s} p50 {p50 / 1000:6.2f} us  p99 {np.percentile(samples, 99) / 1000:6.2f}"
            f" us  ratio {p50 / base:.2f}x"
        )


if __name__ == "__main__":
    main()
