"""Ops that break the device on purpose: one faults, one never returns.

``bench_recovery`` measures how the isolated engine recovers from them; the GPU tests
(``tests/gpu_scripts``) use them too.
"""

from __future__ import annotations

from gpuactors.engine import ArrayParam, OpSpec

BAD = OpSpec(
    name="bad_write",
    params=(ArrayParam(name="out", dtype="float32", direction="out"),),
    body="if (threadIdx.x == 0) { float* p = (float*)0x10; *p = 1.0f; }\nreturn 0;",
)
SPIN = OpSpec(
    name="spin_forever",
    params=(ArrayParam(name="out", dtype="float32", direction="out"),),
    body="volatile int forever = 1;\nwhile (forever) { __nanosleep(1000); }\nreturn 0;",
)
