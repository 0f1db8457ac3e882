// The task-record ABI shared by the host (gpuactors/engine/abi.py mirrors it
// with NumPy dtypes) and the persistent engine kernel.
//
// Everything here is plain-old-data with fixed offsets. A CPU test compiles
// static_asserts generated from the NumPy dtypes against this header with
// NVRTC, so the two sides cannot drift apart silently.
#pragma once

namespace gpa {

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef int i32;

// Arguments per task: array pointers and scalars share the same 8-byte slots.
constexpr int kMaxArgs = 10;

// One task as ops see it (the device's own copy, decoded from the ring's RingRecord).
struct alignas(64) TaskRecord {
    u64 seq;              //   0  ring position + 1
    u32 op;               //   8  physical op id inside the engine module
    u32 blocks;           //  12  blocks (units) the task may span; 0 = 1
    u64 n;                //  16  element count
    u64 deadline_ns;      //  24  %globaltimer deadline; 0 = none
    u64 args[kMaxArgs];   //  32  pointer or scalar bits, per op signature
    u64 tag;              // 112  0 (reserved)
    u64 reserved;         // 120
};

// One task in the host ring (pinned host memory, read by the device): the wire form
// of a TaskRecord, whose every word the device can check on its own.
//
// `seq` is a per-slot sequence number (bounded MPMC ring): the slot at ring
// position p is free for the producer while seq == p, holds a published task
// while seq == p + 1, and is handed back for the next lap (seq = p + capacity)
// only once the task has COMPLETED, so the device copy of a record and its
// completion slot are never overwritten while the task is alive.
//
// Every other word carries 56 bits of payload and, in its top byte, the tag of the
// ring lap it was written for (wire_tag). The producer rewrites all 15 words on every
// lap, each word's payload before its tag byte, and all before `seq`; a word read in
// one 8-byte load with the current lap's tag is therefore this lap's value, and a
// record whose 15 tags all match is whole.
// That lets the idle dispatcher read a record in the same PCIe round trip as its
// sequence number, with no ordering between the two reads (see engine.cuh).
//
// Words (index = 8-byte offset, the same as the TaskRecord word it decodes to):
//   1  op | blocks << 32 (blocks clamped to 2^24 - 1 by the host)
//   2  n, low 56 bits (top byte in word 15)
//   3  deadline_ns >> kDeadlineShift, rounded up (0 = none)
//   4..13  args[0..9], low 56 bits
//   14  top bytes of args[0..6], one byte each
//   15  top bytes of args[7..9] (bytes 0..2) and of n (byte 3)
struct alignas(64) RingRecord {
    u64 seq;              //   0  written last by the producer (release)
    u64 words[15];        //   8  tagged words 1..15
};

constexpr int kWireTagShift = 56;
constexpr u64 kWirePayloadMask = (1ULL << kWireTagShift) - 1;
constexpr int kDeadlineShift = 10;   // deadlines travel in units of 1024 ns
constexpr int kWireFirstArg = 4;     // word of args[0]
constexpr int kWireHighWord0 = 14;   // top bytes of args[0..6]
constexpr int kWireHighWord1 = 15;   // top bytes of args[7..9], then of n
constexpr int kWireArgsInWord0 = 7;

// The tag of ring position `pos`'s lap: never 0 (zeroed memory is never whole) and
// different for consecutive laps of a slot (the only stale words a slot can hold).
__device__ __forceinline__ u64 wire_tag(u64 pos, u32 lap_shift) {
    return 0x80ULL | ((pos >> lap_shift) & 0x7FULL);
}

// How to decode RingRecord word `r` into TaskRecord word `r` (0..15): worked out once
// per lane, so the decode itself is a few selects (no branches for lanes to diverge on).
struct WireDecoder {
    u64 payload_mask;   // word 0 (seq) whole; words 14 and 15 decode to 0
    u32 payload_shift;  // the deadline's units
    u32 top_shift;      // where the word's top byte sits in its high-byte word
    bool has_top;
    bool from_high1;
};

__device__ __forceinline__ WireDecoder wire_decoder(u32 r) {
    WireDecoder d;
    d.payload_mask = r == 0 ? ~0ULL : (r >= (u32)kWireHighWord0 ? 0ULL : kWirePayloadMask);
    d.payload_shift = r == 3 ? (u32)kDeadlineShift : 0u;
    const u32 arg = r - (u32)kWireFirstArg;  // wraps for r < 4: not an argument
    d.has_top = r == 2 || arg < (u32)kMaxArgs;
    d.from_high1 = r == 2 || (d.has_top && arg >= (u32)kWireArgsInWord0);
    d.top_shift = r == 2 ? 8u * (kMaxArgs - kWireArgsInWord0)
                         : 8u * (arg < (u32)kWireArgsInWord0 ? arg : arg - kWireArgsInWord0);
    return d;
}

__device__ __forceinline__ u64 decode_wire(const WireDecoder& d, u64 w, u64 high0, u64 high1) {
    const u64 high = d.from_high1 ? high1 : high0;
    const u64 top = d.has_top ? ((high >> d.top_shift) & 0xFFULL) << kWireTagShift : 0ULL;
    return ((w & d.payload_mask) << d.payload_shift) | top;
}

// One completion marker per ring slot, keyed by the task's sequence number
// (never by slot alone: a reader that sees an old seq knows it is not done).
struct alignas(32) Completion {
    u64 seq;              //   0  task sequence number (ring position + 1), written last
    i32 status;           //   8  0 = ok, > 0 op-defined failure, < 0 engine codes below
    u32 units;            //  12  blocks the task actually ran on
    u64 t_start_ns;       //  16  %globaltimer when its first block started
    u64 t_end_ns;         //  24  %globaltimer when its last block finished
};

// Host <-> device control block (pinned host memory).
struct alignas(64) HostControl {
    u64 park_request;     //   0  host: non-zero asks the kernel to park at a task boundary
    u64 parked_epoch;     //   8  device: bumped (release) when a kernel instance has fully exited
    u64 launched_epoch;   //  16  device: bumped when a kernel instance starts
    u64 consumed;         //  24  device: ring positions taken so far (mirror of the tail)
    u64 heartbeat_ns;     //  32  device: %globaltimer of the dispatcher's last loop
    u64 exit_reason;      //  40  device: why the last instance exited (kExit*)
    u64 reserved0;        //  48
    u64 reserved1;        //  56
};

// Engine status codes written into Completion::status.
constexpr i32 kStatusOk = 0;
constexpr i32 kStatusUnknownOp = -1;
constexpr i32 kStatusDeadline = -2;
constexpr i32 kStatusBatchFailed = -3;  // an expanded batch: some task failed (its statuses say which)

// A batch the device expands (engine.cuh, run_batch_unit). An EnqueueBatch is a ring
// record per 65,536 tasks: op kBatchOp, n = the record's tasks, blocks = the worker
// blocks it may use, args[0] = its BatchDesc in device memory. The host writes the
// descriptors and columns (one H2D copy, or one per piece past 1 MiB) before it
// publishes the records; each unit then claims tasks from its record's `next` until none
// is left, builds each task's record from the shared words and the per-task columns (an
// argument's word: its base plus its column's value times its scale, so a column of
// element offsets becomes pointers on the device), runs it and writes its status. The
// host's cost of a batch is then one copy and a few records, whatever its size.
constexpr u32 kBatchOp = 0xFFFFFFFFu;

struct alignas(16) BatchDesc {
    u64 count;                // 0    tasks
    u64 next;                 // 8    tasks claimed so far (atomicAdd; the host writes 0)
    u64 n;                    // 16   every task's n, unless n_column
    const u64* n_column;      // 24   per-task n, or null
    u64 deadline_ns;          // 32   %globaltimer deadline of every task; 0 = none
    i32* statuses;            // 40   per task: its status, written by the block that ran it
    u32 op;                   // 48   physical op id of every task
    u32 reserved;             // 52
    u64 args[kMaxArgs];       // 56   each argument's word; with a column, the base
    const u64* columns[kMaxArgs];  // 136  per task: args[a] + columns[a][t] * scales[a];
                                   //      null: args[a] + t * scales[a] (evenly spaced)
    u64 scales[kMaxArgs];     // 216  e.g. the item size: a column of offsets makes pointers;
                              //      0 with no column: one word for every task
};

// Why a kernel instance exited.
constexpr u64 kExitIdle = 1;
constexpr u64 kExitParkRequest = 2;
constexpr u64 kExitResidency = 3;
constexpr u64 kExitDrained = 4;   // launch-per-batch mode: nothing left to do

}  // namespace gpa
