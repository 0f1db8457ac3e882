// The persistent engine kernel. Included LAST by a generated engine module,
// after the ops and `gpa::dispatch(const TaskCtx&)` are defined.
//
// Roles inside one grid:
//   * block 0, warp 0 is the only code that polls host memory (the ring). It
//     copies ready records into device memory and publishes "units" (one per
//     block a task spans) through a device-memory queue.
//   * every other block is a worker: it claims a unit with one atomic, waits
//     for it on device memory, runs the op and, if it is the task's last unit,
//     publishes the completion to host memory with release semantics and hands
//     the ring slot back to the producer.
//   * a lone one-block task (one request at a time: the latency-bound case) is
//     run by block 0 itself, all its warps together, with no hand-off; the poll
//     resumes when it is done. Bounded by `inline_max_n`.
// The kernel parks (exits) when it has been idle for `idle_ns`, when it has
// run for `max_residency_ns` (so a module load elsewhere in the process can
// proceed), or when the host asks; everything it needs to resume lives in
// DeviceState, so the next instance -- of this module or of a newly built
// one -- carries on from the same ring position.
#pragma once
#include "abi.cuh"
#include "task.cuh"

#ifndef GPA_BLOCK_THREADS
#define GPA_BLOCK_THREADS 256
#endif

namespace gpa {

// One block's share of one task.
struct Unit {
    u32 slot;    // ring slot of the task (index into the device copies)
    u32 rank;
    u32 count;
    u32 reserved;
};

// Engine state in device memory; survives kernel relaunches and module swaps.
struct DeviceState {
    u64 tail;          // ring positions consumed (dispatcher only)
    u64 unit_head;     // units published (dispatcher only, release)
    u64 unit_claim;    // units claimed by workers (atomicAdd)
    u64 unit_done;     // units finished (atomicAdd)
    u32 stop;          // set by the dispatcher when the instance parks
    u32 exited;        // blocks of this instance that have exited
    u64 exit_reason;
};

struct EngineParams {
    RingRecord* ring;          // pinned host
    Completion* completions;   // pinned host
    HostControl* control;      // pinned host
    DeviceState* state;        // device
    TaskRecord* tasks;         // device copies of records, one per slot
    u32* units_left;           // per slot
    i32* task_status;          // per slot
    u64* t_start;              // per slot
    Unit* units;               // unit queue
    u64 capacity;              // ring slots, power of two
    u64 unit_capacity;         // unit queue entries, power of two
    u64 idle_ns;
    u64 max_residency_ns;      // 0 = unbounded
    u32 max_units_per_task;
    u32 persistent;            // 0 = launch-per-batch: exit as soon as drained
    u64 inline_max_n;          // a lone one-block task up to this n runs on block 0; 0 = never
};

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u64 ld_relaxed_sys(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// After relaxed loads, an acquire pattern: later loads see what the host wrote before
// the values those loads returned. Before relaxed stores, a release pattern: whoever
// sees those stores sees everything written before the fence.
__device__ __forceinline__ void fence_acq_rel_sys() {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ld_acquire_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_acquire_gpu32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_gpu(u64* p, u64 v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu32(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Publish a finished task: its completion marker, then its ring slot for the next lap.
// One release covers both markers: the task's results (every thread's, ordered by the
// caller's barrier) and the completion fields before either of them.
__device__ __forceinline__ void publish_completion(Completion* completions, RingRecord* ring,
                                                   u64 capacity, u32 slot, u64 seq, i32 status,
                                                   u32 units, u64 t_start) {
    Completion* c = &completions[slot];
    volatile Completion* vc = c;
    vc->status = status;
    vc->units = units;
    vc->t_start_ns = t_start;
    vc->t_end_ns = now_ns();
    fence_acq_rel_sys();
    st_relaxed_sys(&c->seq, seq);
    st_relaxed_sys(&ring[slot].seq, seq - 1 + capacity);
}

// The lone task block 0 runs itself (see run_dispatcher): shared by its warps.
struct InlineTask {
    TaskRecord rec;
    Completion* completions;  // where it completes (copies of the engine's params)
    RingRecord* ring;
    u64 capacity;
    u64 t_start;
    u32 slot;
    u32 run;       // 1: run `rec`; 0: the dispatcher has exited
    u32 expired;
    i32 status;
};

// Block 0's warps meet here: warp 0 with a lone task (or its exit), the others waiting.
// Warp 0 and the others reach it from different places, so it is the non-aligned form.
__device__ __forceinline__ void dispatcher_block_barrier() {
    asm volatile("barrier.sync 1, %0;" ::"r"(blockDim.x) : "memory");
}

// Every thread of block 0 runs the lone task's op: a worker's one-block unit without
// the hand-off through device memory (the unit queue, the device copy of the record).
// Its inputs may be read through block 0's L1, which no other SM's writes update: it
// holds no stale line because each lone task ends with the fence.acq_rel.sys of its
// completion, which empties L1, and block 0 reads nothing else of device memory
// between tasks (tests/test_engine_inline_reads_gpu.py guards this). An acquire fence
// here as well would lengthen every lone task (docs/architecture.md, the probes).
// Not inlined: warp 0 and the other warps call it from different places, and the op's
// barriers must be the same instructions for every thread of the block.
// It takes everything it needs from `t` (a reference to the params would put them on
// the stack of the whole kernel).
__device__ __noinline__ void run_inline(InlineTask& t) {
    if (threadIdx.x == 0) {
        const u64 now = now_ns();
        t.t_start = now;
        t.expired = (t.rec.deadline_ns != 0 && now > t.rec.deadline_ns) ? 1u : 0u;
        t.status = 0;
    }
    __syncthreads();
    i32 rc;
    if (t.expired) {
        rc = kStatusDeadline;
    } else {
        TaskCtx ctx;
        ctx.rec = &t.rec;
        ctx.rank = 0;
        ctx.units = 1;
        rc = dispatch(ctx);
    }
    if (rc != 0) t.status = rc;
    __syncthreads();
    if (threadIdx.x == 0) {
        publish_completion(t.completions, t.ring, t.capacity, t.slot, t.rec.seq, t.status, 1u,
                           t.t_start);
    }
}

// Ring positions the dispatcher examines per poll, in groups of one per lane.
constexpr u32 kTakeGroups = 4;

// Warp 0 of block 0. All lanes run it; lane 0 owns the scalar state writes.
// A lone task found by an idle poll (the latency-bound case: one request, nothing else
// in flight) runs on block 0 itself, with the block's other warps (`inline_task`).
__device__ void run_dispatcher(const EngineParams& P, InlineTask& inline_task) {
    const u32 lane = threadIdx.x & 31u;
    const u32 full = 0xffffffffu;
    DeviceState* S = P.state;
    HostControl* ctrl = P.control;
    const u64 ring_mask = P.capacity - 1;
    const u64 unit_mask = P.unit_capacity - 1;
    const u32 lap_shift = (u32)(__ffsll((long long)P.capacity) - 1);
    // This lane's words of a record: word `lane` as the idle poll reads them, words
    // 2 * (lane % 8) and the next as the general path's 16-byte loads do.
    const WireDecoder idle_decoder = wire_decoder(lane);
    const WireDecoder pair_decoder[2] = {wire_decoder(2 * (lane & 7u)),
                                         wire_decoder(2 * (lane & 7u) + 1)};

    u64 tail = S->tail;
    u64 unit_head = S->unit_head;
    u64 known_done = S->unit_done;  // a lower bound of unit_done: room known without a load
    const u64 started = now_ns();
    u64 last_work = started;
    u64 reason = 0;
    bool parking = false;
    bool burst = false;  // the last poll took a full group: look further ahead
    bool busy = false;   // the last poll took something: every lane looks
    u32 iter = 0;

    if (lane == 0) {
        st_release_sys(&ctrl->launched_epoch, ctrl->launched_epoch + 1);
    }
    while (true) {
        // Every 16th poll also reads the park request and beats the heartbeat. The
        // request is loaded relaxed and before the poll's acquire, so both PCIe reads
        // are in flight together (nothing read later depends on the request).
        const bool check_host = !parking && (iter++ & 15u) == 0;
        u64 request = 0;
        if (check_host && lane == 0) request = ld_relaxed_sys(&ctrl->park_request);
        u32 taken = 0;
        const bool was_idle = !busy;
        u64 spec = 0;  // idle: lane r (0..15) holds the slot's word r, lane 16 the next seq
        if (!parking && !busy) {
            // Idle: ONE relaxed load instruction reads the slot's sequence number (lane 0),
            // its 15 tagged words (lanes 1..15) and the next slot's sequence number (lane
            // 16), so a lone task costs one PCIe round trip, not two (sequence number, then
            // record). Nothing orders these reads, so a word may predate the host's write
            // of it: its tag says (abi.cuh). A torn read is not taken; the next poll reads
            // the slot again. A whole record is all the device reads of the host's (the
            // op's data is in device memory), so no acquire is needed. (An acquire load of
            // the sequence number beside relaxed loads of the words made the poll a round
            // trip longer: it waited for them.) Polling one slot makes each poll short, so
            // a lone task is seen sooner; tasks that arrive together are all taken one
            // poll later.
            const u64 slot = tail & ring_mask;
            if (lane <= 16u) {
                spec = ld_relaxed_sys(lane == 0u   ? &P.ring[slot].seq
                                      : lane <= 15u ? &P.ring[slot].words[lane - 1]
                                                    : &P.ring[(tail + 1) & ring_mask].seq);
            }
            const u64 tag = wire_tag(tail, lap_shift);
            const bool whole =
                __all_sync(full, lane == 0u || lane > 15u || (spec >> kWireTagShift) == tag);
            taken = (whole && __shfl_sync(full, spec, 0) == tail + 1) ? 1u : 0u;
            busy = taken > 0u;
        } else if (!parking) {
            // Each lane looks at one ring position, or in a burst (the last take was a
            // full 32) at kTakeGroups positions 32 apart: one PCIe round trip reads up
            // to 32 * kTakeGroups sequence numbers. Groups 1.. are read relaxed and
            // first, group 0 with an acquire last: an acquire holds back later loads,
            // not earlier ones, so all of them are in flight at once. A take beyond
            // group 0 is made an acquire of every group by one fence. Out of a burst
            // the poll is one acquire load per lane.
            u64 seen[kTakeGroups];
#pragma unroll
            for (u32 g = 1; g < kTakeGroups; ++g) {
                seen[g] = burst ? ld_relaxed_sys(&P.ring[(tail + lane + 32u * g) & ring_mask].seq)
                                : 0;  // never a sequence number (they start at 1)
            }
            seen[0] = ld_acquire_sys(&P.ring[(tail + lane) & ring_mask].seq);
            bool ready[kTakeGroups];
#pragma unroll
            for (u32 g = 0; g < kTakeGroups; ++g) ready[g] = seen[g] == tail + lane + 32u * g + 1;
#pragma unroll
            for (u32 g = 0; g < kTakeGroups; ++g) {  // the ready prefix, in ring order
                const u32 ballot = __ballot_sync(full, ready[g]);
                if (taken == 32u * g) taken += (~ballot == 0u) ? 32u : (u32)(__ffs(~ballot) - 1);
            }
            burst = taken >= 32u;
            busy = taken > 0u;
            if (taken > 32u) fence_acq_rel_sys();
            __syncwarp();  // every lane's acquire is ordered before any lane's record loads
        }
        if (check_host) {  // what it found is still taken below: parking waits for it
            const u64 t = now_ns();
            if (lane == 0) *(volatile u64*)&ctrl->heartbeat_ns = t;
            request = __shfl_sync(full, request, 0);
            if (request) {
                parking = true;
                reason = kExitParkRequest;
            } else if (P.max_residency_ns && t - started > P.max_residency_ns) {
                parking = true;
                reason = kExitResidency;
            }
        }
        if (taken > 0) {
            // A task an idle poll found is in the registers (lane r: word r). It runs
            // here and now, on this block, if it is a lone task: no unit in flight, the
            // next slot not ready, one block and n <= inline_max_n. Otherwise it takes
            // the general path, with the record already read.
            u32 near_blocks = 0;  // with four records or fewer: this lane's task's blocks
            if (was_idle) {
                const u64 high0 = __shfl_sync(full, spec, kWireHighWord0);
                const u64 high1 = __shfl_sync(full, spec, kWireHighWord1);
                const u64 word = decode_wire(idle_decoder, spec, high0, high1);
                const u32 blocks = (u32)(__shfl_sync(full, word, 1) >> 32);
                const u64 n = __shfl_sync(full, word, 2);
                const bool next_ready = __shfl_sync(full, spec, 16) == tail + 2;
                const u32 op = (u32)__shfl_sync(full, word, 1);
                if (known_done == unit_head && P.inline_max_n != 0 && blocks <= 1u &&
                    n <= P.inline_max_n && !next_ready && op != kBatchOp) {
                    if (lane < 16u) reinterpret_cast<u64*>(&inline_task.rec)[lane] = word;
                    if (lane == 0) {
                        inline_task.slot = (u32)(tail & ring_mask);
                        inline_task.run = 1u;
                    }
                    __syncwarp();
                    dispatcher_block_barrier();  // the block's other warps join
                    run_inline(inline_task);
                    tail += 1;
                    last_work = now_ns();
                    continue;
                }
                if (lane < 16u) reinterpret_cast<u64*>(&P.tasks[tail & ring_mask])[lane] = word;
                near_blocks = blocks;
            } else {
                // Copy the taken records to device memory, 16 bytes a lane (four
                // records per warp-wide load), decoded. All loads are issued before any
                // store, so the PCIe round trips overlap. The ballots order these
                // loads after each record's acquire of its sequence number, so every
                // word is this lap's.
                u64 lo[8 * kTakeGroups], hi[8 * kTakeGroups];  // every lane shuffles them below
#pragma unroll
                for (u32 k = 0; k < 8 * kTakeGroups; ++k) lo[k] = hi[k] = 0;
#pragma unroll
                for (u32 k = 0; k < 8 * kTakeGroups; ++k) {
                    const u32 rec = (lane >> 3) + 4u * k;
                    if (rec < taken) {
                        const u64 s = (tail + rec) & ring_mask;
                        const u64* src = reinterpret_cast<const u64*>(&P.ring[s]) + 2 * (lane & 7u);
                        asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
                                     : "=l"(lo[k]), "=l"(hi[k]) : "l"(src));
                    }
                }
#pragma unroll
                for (u32 k = 0; k < 8 * kTakeGroups; ++k) {
                    // Lane 7 of each group of 8 holds its record's words 14 and 15.
                    const u64 high0 = __shfl_sync(full, lo[k], lane | 7u);
                    const u64 high1 = __shfl_sync(full, hi[k], lane | 7u);
                    const u32 rec = (lane >> 3) + 4u * k;
                    if (rec < taken) {
                        const u64 s = (tail + rec) & ring_mask;
                        u64* dst = reinterpret_cast<u64*>(&P.tasks[s]) + 2 * (lane & 7u);
                        dst[0] = decode_wire(pair_decoder[0], lo[k], high0, high1);
                        dst[1] = decode_wire(pair_decoder[1], hi[k], high0, high1);
                    }
                }
                // With four records or fewer (a light load) each lane takes its
                // task's block count from the registers that loaded the record (word 1,
                // bits 32..55, held by lane 8 * record) instead of reading it back.
                near_blocks =
                    __shfl_sync(full, (u32)((hi[0] & kWirePayloadMask) >> 32), (lane & 3u) * 8u);
            }
            __syncwarp();
            // Hand the tasks to the workers 32 at a time: each group's units fit
            // the unit queue (sized for 32 maximal tasks).
            for (u32 first = 0; first < taken; first += 32u) {
                const u32 index = first + lane;
                const u64 slot = (tail + index) & ring_mask;
                u32 my_units = 0;
                if (index < taken) {
                    const u32 asked = taken <= 4u ? near_blocks : P.tasks[slot].blocks;
                    my_units = asked == 0 ? 1u : (asked > P.max_units_per_task ? P.max_units_per_task : asked);
                    if (my_units > 1u) {  // (a one-block task needs no merging)
                        P.units_left[slot] = my_units;
                        P.task_status[slot] = 0;
                    }
                }
                u32 incl = my_units;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const u32 v = __shfl_up_sync(full, incl, off);
                    if (lane >= (u32)off) incl += v;
                }
                const u32 total = __shfl_sync(full, incl, 31);
                // Room in the unit queue: never overwrite a unit not yet finished.
                while (unit_head + total - known_done > P.unit_capacity) {
                    u64 done = 0;
                    if (lane == 0) done = ld_acquire_gpu(&S->unit_done);
                    known_done = __shfl_sync(full, done, 0);
                    if (unit_head + total - known_done <= P.unit_capacity) break;
                    __nanosleep(64);
                }
                const u32 excl = incl - my_units;
                for (u32 r = 0; r < my_units; ++r) {
                    Unit u;
                    u.slot = (u32)slot;
                    u.rank = r;
                    u.count = my_units;
                    u.reserved = 0;
                    P.units[(unit_head + excl + r) & unit_mask] = u;
                }
                // The warp barrier orders every lane's stores before lane 0's release
                // (a release is cumulative): workers that see the head see the units.
                __syncwarp();
                if (lane == 0) st_release_gpu(&S->unit_head, unit_head + total);
                unit_head += total;
            }
            tail += taken;
            last_work = now_ns();
        }
        if (taken == 0) {
            // Units in flight unless the lower bound already says all are done (always,
            // after lone tasks run on this block): then an idle poll loads nothing more.
            if (known_done != unit_head) {
                u64 done = 0;
                if (lane == 0) done = ld_acquire_gpu(&S->unit_done);
                known_done = __shfl_sync(full, done, 0);
            }
            if (known_done == unit_head) {  // nothing in flight
                if (parking) break;
                if (!P.persistent) {
                    reason = kExitDrained;
                    break;
                }
                if (now_ns() - last_work > P.idle_ns) {
                    reason = kExitIdle;
                    break;
                }
            }
        }
    }
    if (lane == 0) {
        S->tail = tail;
        S->exit_reason = reason;
        __threadfence();
        st_release_gpu32(&S->stop, 1u);
    }
}

// Reads of what the host copied into device memory for a batch: through L2 only. The
// memory pool hands a finished batch's addresses to the next, so a line this SM's L1
// still holds from then must not be read.
__device__ __forceinline__ u64 ld_batch(const u64* p) { return __ldcg(p); }

// One unit of an expanded batch (abi.cuh, BatchDesc): claim tasks one at a time until
// none is left, run each as a one-block task and write its status. Every thread of the
// block calls it. Returns kStatusBatchFailed (thread 0) if a task this unit ran failed,
// else 0: the batch's record completes with that status (merged over its units as any
// task's).
//
// Each task's claim is made while the one before runs, so its latency hides behind the
// op; the claimed index and the status go through two shared slots used in turn, which
// leaves two barriers a task: one after its record is built, one after it ran.
__device__ __noinline__ i32 run_batch_unit(BatchDesc* desc) {
    __shared__ TaskRecord b_rec;
    __shared__ u64 b_index[2];
    __shared__ i32 b_status[2];
    __shared__ u32 b_expired;
    const u64 count = ld_batch(&desc->count);
    const u64 deadline = ld_batch(&desc->deadline_ns);
    // Thread a < kMaxArgs builds argument a of every task, thread kMaxArgs the count.
    const u32 tid = threadIdx.x;
    const u64* column = nullptr;
    u64 shared_word = 0;  // the word, or the base that values are scaled onto
    u64 scale = 0;
    if (tid < (u32)kMaxArgs) {
        column = reinterpret_cast<const u64*>(ld_batch(reinterpret_cast<const u64*>(&desc->columns[tid])));
        shared_word = ld_batch(&desc->args[tid]);
        scale = ld_batch(&desc->scales[tid]);
    } else if (tid == (u32)kMaxArgs) {
        column = reinterpret_cast<const u64*>(ld_batch(reinterpret_cast<const u64*>(&desc->n_column)));
        shared_word = ld_batch(&desc->n);  // (0 with a column)
    }
    i32* statuses = nullptr;
    bool failed = false;
    if (tid == 0) {
        statuses = reinterpret_cast<i32*>(ld_batch(reinterpret_cast<const u64*>(&desc->statuses)));
        b_rec.op = (u32)ld_batch(reinterpret_cast<const u64*>(&desc->op));
        b_rec.blocks = 1;
        b_rec.deadline_ns = deadline;
        b_rec.tag = 0;
        b_rec.reserved = 0;
        b_index[0] = atomicAdd(&desc->next, 1ULL);
        b_status[0] = 0;
    }
    __syncthreads();
    for (u32 k = 0;; k ^= 1u) {
        const u64 t = b_index[k];
        if (t >= count) break;
        if (tid < (u32)kMaxArgs) {
            // No column: evenly spaced words (the task's index times the scale), or
            // one word for every task (scale 0).
            b_rec.args[tid] = shared_word + (column ? ld_batch(column + t) : t) * scale;
        } else if (tid == (u32)kMaxArgs) {
            b_rec.n = column ? ld_batch(column + t) : shared_word;
            b_rec.seq = t;
            b_expired = (deadline != 0 && now_ns() > deadline) ? 1u : 0u;
        }
        __syncthreads();
        u64 claimed = 0;
        if (tid == 0) claimed = atomicAdd(&desc->next, 1ULL);  // the next, while this runs
        i32 rc;
        if (b_expired) {
            rc = kStatusDeadline;
        } else {
            TaskCtx ctx;
            ctx.rec = &b_rec;
            ctx.rank = 0;
            ctx.units = 1;
            rc = dispatch(ctx);
        }
        if (rc != 0) b_status[k] = rc;
        if (tid == 0) {
            b_index[k ^ 1u] = claimed;
            b_status[k ^ 1u] = 0;
        }
        // Every thread is done with this task's record, and sees the next index.
        __syncthreads();
        if (tid == 0) {
            statuses[t] = b_status[k];
            failed = failed || b_status[k] != 0;
        }
    }
    return failed ? kStatusBatchFailed : 0;
}

__device__ void run_worker(const EngineParams& P) {
    __shared__ TaskRecord s_rec;
    __shared__ Unit s_unit;
    __shared__ u32 s_go;
    __shared__ u32 s_expired;
    __shared__ i32 s_status;
    __shared__ u64 s_t_start;
    DeviceState* S = P.state;
    const u64 unit_mask = P.unit_capacity - 1;

    while (true) {
        if (threadIdx.x == 0) {
            const u64 u = atomicAdd(&S->unit_claim, 1ULL);
            u32 go = 0;
            u32 backoff = 32;
            while (true) {
                if (ld_acquire_gpu(&S->unit_head) > u) {
                    go = 1;
                    break;
                }
                if (ld_acquire_gpu32(&S->stop)) break;
                __nanosleep(backoff);
                if (backoff < 128) backoff <<= 1;
            }
            s_go = go;
            if (go) {
                s_unit = P.units[u & unit_mask];
                s_status = 0;
            }
        }
        __syncthreads();
        if (!s_go) break;
        const Unit unit = s_unit;
        if (threadIdx.x < 16) {
            reinterpret_cast<u64*>(&s_rec)[threadIdx.x] =
                reinterpret_cast<const volatile u64*>(&P.tasks[unit.slot])[threadIdx.x];
        }
        if (threadIdx.x == 0) {
            const u64 t = now_ns();
            s_t_start = t;
            if (unit.rank == 0 && unit.count > 1) P.t_start[unit.slot] = t;
            // One thread decides, so the whole block either runs the op or skips it:
            // ops may use __syncthreads(), which every thread must reach. (An expanded
            // batch's tasks each check the deadline themselves.)
            const u64 deadline = reinterpret_cast<const volatile u64*>(&P.tasks[unit.slot])[3];
            const u32 op = reinterpret_cast<const volatile u32*>(&P.tasks[unit.slot])[2];
            s_expired = (op != kBatchOp && deadline != 0 && t > deadline) ? 1u : 0u;
        }
        __syncthreads();
        i32 rc;
        if (s_expired) {
            rc = kStatusDeadline;
        } else if (s_rec.op == kBatchOp) {
            rc = run_batch_unit(reinterpret_cast<BatchDesc*>(s_rec.args[0]));
        } else {
            TaskCtx ctx;
            ctx.rec = &s_rec;
            ctx.rank = unit.rank;
            ctx.units = unit.count;
            rc = dispatch(ctx);
        }
        if (rc != 0) s_status = rc;
        __syncthreads();
        if (threadIdx.x == 0) {
            // A task on one block (the common, latency-bound case) finishes here with no
            // device atomics; the blocks of a larger task merge their status and find
            // the last one through per-slot counters.
            bool last = true;
            i32 status = s_status;
            u64 t_start = s_t_start;
            if (unit.count > 1) {
                if (status != 0) atomicCAS(&P.task_status[unit.slot], 0, status);
                __threadfence();
                last = atomicSub(&P.units_left[unit.slot], 1u) == 1u;
                if (last) {
                    __threadfence();
                    status = *(volatile i32*)&P.task_status[unit.slot];
                    t_start = *(volatile u64*)&P.t_start[unit.slot];
                }
            }
            if (last) {
                publish_completion(P.completions, P.ring, P.capacity, unit.slot, s_rec.seq, status,
                                   unit.count, t_start);
            }
            __threadfence();
            atomicAdd(&S->unit_done, 1ULL);
        }
        __syncthreads();
    }
}

}  // namespace gpa

extern "C" __global__ void __launch_bounds__(GPA_BLOCK_THREADS)
gpa_engine(const gpa::EngineParams* params) {
    const gpa::EngineParams P = *params;
    if (blockIdx.x == 0) {
        __shared__ gpa::InlineTask inline_task;
        if (threadIdx.x == 0) {
            inline_task.completions = P.completions;
            inline_task.ring = P.ring;
            inline_task.capacity = P.capacity;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            gpa::run_dispatcher(P, inline_task);
            if (threadIdx.x == 0) inline_task.run = 0;
            __syncwarp();
            gpa::dispatcher_block_barrier();  // release the other warps
        } else {
            while (true) {
                gpa::dispatcher_block_barrier();
                if (!inline_task.run) break;
                gpa::run_inline(inline_task);
            }
        }
    } else {
        gpa::run_worker(P);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        gpa::DeviceState* S = P.state;
        __threadfence();
        const gpa::u32 prev = atomicAdd(&S->exited, 1u);
        if (prev == gridDim.x - 1) {  // last block out resets the instance state
            __threadfence();  // (an acquire of what the others wrote before their exit)
            S->unit_claim = S->unit_head;
            S->stop = 0;
            S->exited = 0;
            __threadfence();
            volatile gpa::HostControl* ctrl = P.control;
            ctrl->consumed = S->tail;
            ctrl->exit_reason = S->exit_reason;
            __threadfence_system();
            gpa::st_release_sys(&P.control->parked_epoch, P.control->parked_epoch + 1);
        }
    }
}

// The device's clock (%globaltimer), read for the host: task deadlines are in device
// time, and the host measures its own clock's offset from it with this kernel.
extern "C" __global__ void gpa_clock(unsigned long long* out) {
    *(volatile unsigned long long*)out = gpa::now_ns();
    __threadfence_system();
}
