// What an op sees of its task: the record, which block of the task it is,
// and small helpers for block-cooperative loops. Included by every engine
// module before the ops.
#pragma once
#include "abi.cuh"

namespace gpa {

// A task may span several blocks ("units"). Each unit runs the op once with
// its own rank; loops stride over the task's elements across all its units.
struct TaskCtx {
    const TaskRecord* rec;
    u32 rank;     // this block's index within the task
    u32 units;    // how many blocks the task spans

    __device__ __forceinline__ u64 n() const { return rec->n; }

    // First element this thread handles and the stride over the whole task.
    __device__ __forceinline__ u64 first() const { return (u64)rank * blockDim.x + threadIdx.x; }
    __device__ __forceinline__ u64 stride() const { return (u64)units * blockDim.x; }

    template <class T>
    __device__ __forceinline__ T* ptr(int i) const { return reinterpret_cast<T*>(rec->args[i]); }

    template <class T>
    __device__ __forceinline__ T scalar(int i) const {
        static_assert(sizeof(T) <= sizeof(u64), "scalars are at most 8 bytes");
        union { u64 bits; T value; } u;
        u.bits = rec->args[i];
        return u.value;
    }
};

// Sum `v` over the calling block; every thread receives the total.
// Uses a small shared scratch area; all threads of the block must call it.
template <class T>
__device__ __forceinline__ T block_sum(T v) {
    __shared__ T scratch[32];
    __shared__ T total;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const unsigned warps = (blockDim.x + 31u) >> 5;
        T w = lane < warps ? scratch[lane] : T(0);
        for (int off = 16; off > 0; off >>= 1) w += __shfl_down_sync(0xffffffffu, w, off);
        if (lane == 0) total = w;
    }
    __syncthreads();
    T result = total;
    __syncthreads();  // scratch/total may be reused by the next call
    return result;
}

}  // namespace gpa

// Loop over this thread's share of the task's elements: `GPA_FOR_EACH(i) { ... }`.
#define GPA_FOR_EACH(i) \
    for (::gpa::u64 i = ctx.first(), _gpa_n = ctx.n(), _gpa_s = ctx.stride(); i < _gpa_n; i += _gpa_s)

// The same share four elements at a time, for ops whose time is memory latency: the
// body of `GPA_FOR_EACH_4(i) { ... }` handles elements i, i + s, i + 2s, i + 3s
// (s: the stride), each through `GPA_EACH_OF_4(i, k, j) statement;`, which runs the
// statement for k = 0..3 with j the k-th element, skipping those past n. Writing all
// the loads in one GPA_EACH_OF_4 and the stores in the next puts four loads in flight
// per thread instead of one (the bound checks only predicate them).
#define GPA_FOR_EACH_4(i) \
    for (::gpa::u64 i = ctx.first(), _gpa_n = ctx.n(), _gpa_s = ctx.stride(); i < _gpa_n; \
         i += 4 * _gpa_s)
#define GPA_EACH_OF_4(i, k, j) \
    _Pragma("unroll") for (int k = 0; k < 4; ++k) \
        if (const ::gpa::u64 j = i + k * _gpa_s; j < _gpa_n)
