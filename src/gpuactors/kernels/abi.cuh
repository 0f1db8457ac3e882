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

// One task in the host ring (pinned host memory, read by the device).
//
// `seq` is a per-slot sequence number (bounded MPMC ring): the slot at ring
// position p is free for the producer while seq == p, holds a published task
// while seq == p + 1, and is handed back for the next lap (seq = p + capacity)
// only once the task has COMPLETED, so the device copy of a record and its
// completion slot are never overwritten while the task is alive.
struct alignas(64) TaskRecord {
    u64 seq;              //   0  written last by the producer (release)
    u32 op;               //   8  physical op id inside the engine module
    u32 blocks;           //  12  blocks (units) the task may span; 0 = 1
    u64 n;                //  16  element count
    u64 deadline_ns;      //  24  %globaltimer deadline; 0 = none
    u64 args[kMaxArgs];   //  32  pointer or scalar bits, per op signature
    u64 tag;              // 112  opaque host cookie (correlation)
    u64 reserved;         // 120
};

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

// Why a kernel instance exited.
constexpr u64 kExitIdle = 1;
constexpr u64 kExitParkRequest = 2;
constexpr u64 kExitResidency = 3;
constexpr u64 kExitDrained = 4;   // launch-per-batch mode: nothing left to do

}  // namespace gpa
