"""The engine op that runs tiny-op programs: an interpreter, compiled once.

``PROGRAM_OP`` is an ordinary engine op (:class:`~gpuactors.engine.OpSpec`). Its two
arguments are the address and length of a program (:mod:`.program`) in pinned host
memory; it copies the program into shared memory and runs it with registers per
element, so any chain of supported ops runs fused with no compile. A new kind of op
needs a new case here, not a new module. Torch-free (CPU tests compile it with NVRTC).

The body holds no preprocessor directive: the constants are written into the text.
"""

from __future__ import annotations

from gpuactors.engine.ops import OpSpec, ScalarParam
from gpuactors.torch import program as P

#: Elements each thread carries through the instructions at once (their loads and
#: math overlap; the instruction is decoded once for all of them).
ELEMENTS_PER_THREAD = 4
#: Loads a thread of a reduction keeps in flight (a partial result each).
ROW_LOADS = 8
#: Failure codes the op returns (``TaskFailed.code``).
BAD_LENGTH = 2
BAD_HEADER = 3
BAD_STAGE = 4


def _opcode_constants() -> str:
    lines = [f"constexpr unsigned kOp_{name} = {code}u;" for name, code in P.OPCODES.items()]
    return "\n".join(lines)


def _program_body(fetch: str) -> str:
    """The interpreter, with ``fetch`` the expression that reads the program's ``q``-th
    16-byte piece at ``src`` into shared memory."""
    return f"""
// One tiny-op program (gpuactors/torch/program.py; docs/torch.md, "The program format").
constexpr unsigned kMagic = {P.MAGIC}u;
constexpr unsigned kMaxWords = {P.MAX_WORDS}u;
constexpr int kRegs = {P.REGISTERS};
constexpr int kE = {ELEMENTS_PER_THREAD};
constexpr unsigned kRowLoads = {ROW_LOADS}u;
constexpr int kMaxRank = {P.MAX_RANK};
constexpr unsigned kSkip = {P.OP_SKIP}u, kLoad = {P.OP_LOAD}u, kStore = {P.OP_STORE}u;
constexpr unsigned kContig = {P.MODE_CONTIG}u, kStrided = {P.MODE_STRIDED}u;
constexpr unsigned kPointwise = {P.STAGE_POINTWISE}u, kReduce = {P.STAGE_REDUCE}u;
constexpr unsigned kMean = {P.REDUCE_MEAN}u, kAmax = {P.REDUCE_AMAX}u;
constexpr unsigned kP0 = {P.P0}u, kP1 = {P.P1}u;
{_opcode_constants()}
constexpr unsigned kFirstBinary = kOp_add;

alignas(16) __shared__ unsigned gpt_prog[kMaxWords];
__shared__ int gpt_go_on;
__shared__ float gpt_partial[32];

if (words < 8u || words > kMaxWords || (words & 3u) != 0u) return {BAD_LENGTH};
{{
    const uint4* src = reinterpret_cast<const uint4*>(prog);
    uint4* dst = reinterpret_cast<uint4*>(gpt_prog);
    for (unsigned q = threadIdx.x; q < words / 4u; q += blockDim.x) dst[q] = {fetch};
}}
__syncthreads();
const unsigned* P = gpt_prog;
if (P[0] != kMagic || P[1] != words) return {BAD_HEADER};

auto h2f = [](unsigned short h) -> float {{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}};
auto f2h = [](float f) -> unsigned short {{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}};
auto f2bf = [](float f) -> unsigned short {{
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}};
auto bf2f = [](unsigned short h) -> float {{ return __uint_as_float(((unsigned)h) << 16); }};
// The value a tensor of the result's dtype would hold (round: none, f16, bf16, bool).
auto rnd = [&](unsigned mode, float x) -> float {{
    if (mode == 1u) return h2f(f2h(x));
    if (mode == 2u) return bf2f(f2bf(x));
    if (mode == 3u) return (x != 0.0f) ? 1.0f : 0.0f;
    return x;
}};
// Loads go to L2 (.cg): other units, and kernels between tasks, write these tensors.
auto ld = [&](unsigned long long p, unsigned dt, long long off) -> float {{
    if (dt == 0u) return __ldcg(reinterpret_cast<const float*>(p) + off);
    if (dt == 1u) return h2f(__ldcg(reinterpret_cast<const unsigned short*>(p) + off));
    if (dt == 2u) return bf2f(__ldcg(reinterpret_cast<const unsigned short*>(p) + off));
    return (__ldcg(reinterpret_cast<const unsigned char*>(p) + off) != 0) ? 1.0f : 0.0f;
}};
auto st = [&](unsigned long long p, unsigned dt, long long off, float v) {{
    if (dt == 0u) reinterpret_cast<float*>(p)[off] = v;
    else if (dt == 1u) reinterpret_cast<unsigned short*>(p)[off] = f2h(v);
    else if (dt == 2u) reinterpret_cast<unsigned short*>(p)[off] = f2bf(v);
    else reinterpret_cast<unsigned char*>(p)[off] = (v != 0.0f) ? 1 : 0;
}};
auto u64at = [](const unsigned* w) -> unsigned long long {{
    return (unsigned long long)w[0] | ((unsigned long long)w[1] << 32);
}};
// std::max / std::min as PyTorch's kernels use them (a NaN first argument stays).
auto mx = [](float a, float b) -> float {{ return (a < b) ? b : a; }};
auto mn = [](float a, float b) -> float {{ return (b < a) ? b : a; }};

auto unary = [&](unsigned op, float x, float p0, float p1) -> float {{
    switch (op) {{
        case kOp_neg: return -x;
        case kOp_abs: return fabsf(x);
        case kOp_relu: return (x != x) ? x : mx(x, 0.0f);
        case kOp_sigmoid: return 1.0f / (1.0f + expf(-x));
        case kOp_tanh: return tanhf(x);
        case kOp_exp: return expf(x);
        case kOp_log: return logf(x);
        case kOp_sqrt: return sqrtf(x);
        case kOp_rsqrt: return rsqrtf(x);
        case kOp_reciprocal: return 1.0f / x;
        case kOp_sin: return sinf(x);
        case kOp_cos: return cosf(x);
        case kOp_gelu: return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
        case kOp_gelu_tanh: {{
            const float inner = 0.7978845608028654f * (x + 0.044715f * (x * x * x));
            return 0.5f * x * (1.0f + tanhf(inner));
        }}
        case kOp_silu: return x / (1.0f + expf(-x));
        case kOp_softplus: return (x * p0 > p1) ? x : log1pf(expf(x * p0)) / p0;
        case kOp_leaky_relu: return (x > 0.0f) ? x : x * p0;
        case kOp_clamp: return (x != x) ? x : mn(mx(x, p0), p1);
        case kOp_hardsigmoid: return mn(mx(x + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
        case kOp_hardswish: return x * mn(mx(x + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
        case kOp_copy: return x;
        case kOp_log1p: return log1pf(x);
        case kOp_expm1: return expm1f(x);
        case kOp_erf: return erff(x);
        case kOp_floor: return floorf(x);
        case kOp_ceil: return ceilf(x);
        case kOp_trunc: return truncf(x);
        case kOp_round: return rintf(x);
        case kOp_pow_scalar:
            if (p0 == 0.0f) return 1.0f;
            if (p0 == 1.0f) return x;
            if (p0 == 2.0f) return x * x;
            if (p0 == 3.0f) return x * x * x;
            if (p0 == 0.5f) return sqrtf(x);
            if (p0 == -0.5f) return rsqrtf(x);
            if (p0 == -1.0f) return 1.0f / x;
            if (p0 == -2.0f) return 1.0f / (x * x);
            return powf(x, p0);
        case kOp_rpow_scalar: return (p0 == 1.0f) ? 1.0f : powf(p0, x);
        default: return x;
    }}
}};
auto elu = [](float x, float negcoef, float poscoef, float negiptcoef) -> float {{
    return (x > 0.0f) ? x * poscoef : expm1f(x * negiptcoef) * negcoef;
}};
// y_imm: y is a scalar, whose reciprocal the host put in p1 (PyTorch multiplies then).
// rmode: the result's rounding (PyTorch truncates a float16 or bfloat16 quotient).
auto binary = [&](unsigned op, float x, float y, bool y_imm, float p0, float p1,
                  unsigned rmode) -> float {{
    switch (op) {{
        case kOp_add: return x + p0 * y;
        case kOp_mul: return x * y;
        case kOp_div: return x / y;
        case kOp_div_trunc: return y_imm ? truncf(x * p1) : truncf(rnd(rmode, x / y));
        case kOp_div_floor: {{
            if (y == 0.0f) return x / y;
            const float mod = fmodf(x, y);
            float div = y_imm ? (x - mod) * p1 : (x - mod) / y;
            if ((mod != 0.0f) && ((y < 0.0f) != (mod < 0.0f))) div -= 1.0f;
            if (div == 0.0f) return copysignf(0.0f, y_imm ? x * p1 : x / y);
            float fl = floorf(div);
            if (div - fl > 0.5f) fl += 1.0f;
            return fl;
        }}
        case kOp_pow: return powf(x, y);
        case kOp_maximum: return (x != x) ? x : ((y != y) ? y : fmaxf(x, y));
        case kOp_minimum: return (x != x) ? x : ((y != y) ? y : fminf(x, y));
        case kOp_eq: return (x == y) ? 1.0f : 0.0f;
        case kOp_ne: return (x != y) ? 1.0f : 0.0f;
        case kOp_lt: return (x < y) ? 1.0f : 0.0f;
        case kOp_le: return (x <= y) ? 1.0f : 0.0f;
        case kOp_gt: return (x > y) ? 1.0f : 0.0f;
        case kOp_ge: return (x >= y) ? 1.0f : 0.0f;
        default: return x;
    }}
}};

auto run_pointwise = [&](const unsigned* S, unsigned unit, unsigned units) {{
    const unsigned head = S[0];
    const unsigned rank = (head >> 8) & 0xffu;
    const bool coords = ((head >> 16) & 1u) != 0u;
    const unsigned long long numel = u64at(S + 2);
    const unsigned* sizes = S + 4;
    const unsigned* code = S + 4 + rank;
    const unsigned ncode = S[1] - 4u - rank;
    const unsigned long long G = (unsigned long long)units * blockDim.x;
    float R[kRegs][kE];
    unsigned crd[kE][kMaxRank];
    for (unsigned long long base = (unsigned long long)unit * blockDim.x + threadIdx.x;
         base < numel; base += G * kE) {{
        unsigned long long idx[kE];
        bool ok[kE];
        int ne = 0;  // elements of this pass that exist: a prefix, as idx grows with e
        for (int e = 0; e < kE; ++e) {{
            idx[e] = base + (unsigned long long)e * G;
            ok[e] = idx[e] < numel;
            ne += ok[e] ? 1 : 0;
        }}
        if (coords) {{
            for (int e = 0; e < kE; ++e) {{
                unsigned long long rest = ok[e] ? idx[e] : 0ull;
                for (int d = (int)rank - 1; d >= 0; --d) {{
                    crd[e][d] = (unsigned)(rest % sizes[d]);
                    rest /= sizes[d];
                }}
            }}
        }}
        unsigned pc = 0;
        while (pc < ncode) {{
            const unsigned w0 = code[pc];
            const unsigned op = w0 & 0xffu;
            if (op == kSkip) {{
                pc += w0 >> 8;
                continue;
            }}
            if (op == kLoad || op == kStore) {{
                const unsigned reg = (w0 >> 8) & 0x3fu, rmode = (w0 >> 14) & 3u;
                const unsigned dt = (w0 >> 16) & 0xffu, mode = (w0 >> 24) & 0xfu, rk = w0 >> 28;
                const unsigned long long ptr = u64at(code + pc + 1);
                const unsigned* strides = code + pc + 3;
                for (int e = 0; e < kE; ++e) {{
                    if (!ok[e]) continue;
                    long long off = 0;
                    if (mode == kContig) {{
                        off = (long long)idx[e];
                    }} else if (mode == kStrided) {{
                        for (unsigned d = 0; d < rk; ++d)
                            off += (long long)crd[e][d] * (long long)u64at(strides + 2u * d);
                    }}
                    if (op == kLoad) R[reg][e] = rnd(rmode, ld(ptr, dt, off));
                    else st(ptr, dt, off, R[reg][e]);
                }}
                pc += 3u + (mode == kStrided ? 2u * rk : 0u);
                continue;
            }}
            const unsigned dst = (w0 >> 8) & 0x3fu, rmode = (w0 >> 14) & 3u;
            const unsigned ia = (w0 >> 16) & 0xffu, ib = w0 >> 24;
            const float p0 = __uint_as_float(code[pc + 1]);
            const float p1 = __uint_as_float(code[pc + 2]);
            const float p2 = __uint_as_float(code[pc + 3]);
            auto fetch = [&](unsigned which, int e) -> float {{
                if (which < (unsigned)kRegs) return R[which][e];
                return which == kP0 ? p0 : (which == kP1 ? p1 : p2);
            }};
            if (op == kOp_where) {{
                const unsigned ic = code[pc + 1];
                for (int e = 0; e < ne; ++e)
                    R[dst][e] = rnd(rmode, (R[ic][e] != 0.0f) ? fetch(ia, e) : fetch(ib, e));
            }} else if (op == kOp_clamp_tensor) {{
                // PyTorch's clamp with tensor bounds: a NaN anywhere wins, in this order.
                const unsigned ic = code[pc + 1];
                for (int e = 0; e < ne; ++e) {{
                    const float x = fetch(ia, e), lo = fetch(ib, e), hi = R[ic][e];
                    float r = mn(mx(x, lo), hi);
                    if (hi != hi) r = hi;
                    if (lo != lo) r = lo;
                    if (x != x) r = x;
                    R[dst][e] = rnd(rmode, r);
                }}
            }} else if (op == kOp_elu) {{
                for (int e = 0; e < ne; ++e) R[dst][e] = rnd(rmode, elu(fetch(ia, e), p0, p1, p2));
            }} else if (op < kFirstBinary) {{
                for (int e = 0; e < ne; ++e)
                    R[dst][e] = rnd(rmode, unary(op, fetch(ia, e), p0, p1));
            }} else {{
                const bool y_imm = ib >= (unsigned)kRegs;
                for (int e = 0; e < ne; ++e) {{
                    const float r = binary(op, fetch(ia, e), fetch(ib, e), y_imm, p0, p1, rmode);
                    R[dst][e] = rnd(rmode, r);
                }}
            }}
            pc += {P.ALU_WORDS}u;
        }}
    }}
}};

auto run_reduce = [&](const unsigned* S, unsigned unit, unsigned units) {{
    const unsigned head = S[0];
    const unsigned rank = (head >> 8) & 0xffu;
    const unsigned rop = (head >> 16) & 0xffu;
    const unsigned long long rows = u64at(S + 2);
    const unsigned len = S[4];
    const unsigned long long optr = u64at(S + 5);
    const unsigned odt = S[7] & 0xffu, idt = (S[7] >> 8) & 0xffu;
    const unsigned long long iptr = u64at(S + 8);
    const float factor = __uint_as_float(S[10]);
    const unsigned* sizes = S + 11;
    const unsigned* strides = S + 11 + rank;
    const long long last = (long long)u64at(strides + 2u * (rank - 1u));
    const float init = (rop == kAmax) ? __int_as_float(0xff800000) : 0.0f;
    auto row_base = [&](unsigned long long m) -> long long {{
        long long off = 0;
        for (int d = (int)rank - 2; d >= 0; --d) {{
            off += (long long)(m % sizes[d]) * (long long)u64at(strides + 2 * d);
            m /= sizes[d];
        }}
        return off;
    }};
    auto combine = [&](float a, float b) -> float {{
        if (rop == kAmax) return (a != a) ? a : ((b != b) ? b : fmaxf(a, b));
        return a + b;
    }};
    auto warp_combine = [&](float acc) -> float {{
        for (int off = 16; off > 0; off >>= 1)
            acc = combine(acc, __shfl_down_sync(0xffffffffu, acc, off));
        return acc;
    }};
    // The elements r = first, first + stride, ... < len of the row at b, combined. A
    // thread keeps kRowLoads partial results so that as many loads are in flight at
    // once: one accumulator would wait for each load in turn.
    auto accumulate = [&](long long b, unsigned first, unsigned stride) -> float {{
        float part[kRowLoads];
        for (unsigned e = 0; e < kRowLoads; ++e) part[e] = init;
        unsigned r = first;
        for (; r + (kRowLoads - 1u) * stride < len; r += kRowLoads * stride) {{
            float v[kRowLoads];
            for (unsigned e = 0; e < kRowLoads; ++e)
                v[e] = ld(iptr, idt, b + (long long)(r + e * stride) * last);
            for (unsigned e = 0; e < kRowLoads; ++e) part[e] = combine(part[e], v[e]);
        }}
        for (; r < len; r += stride)
            part[0] = combine(part[0], ld(iptr, idt, b + (long long)r * last));
        float acc = part[0];
        for (unsigned e = 1; e < kRowLoads; ++e) acc = combine(acc, part[e]);
        return acc;
    }};
    auto finish = [&](unsigned long long m, float acc) {{
        st(optr, odt, (long long)m, (rop == kMean) ? acc * factor : acc);
    }};
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (len <= 512u) {{
        // A warp per row.
        for (unsigned long long m = (unsigned long long)unit * warps + warp; m < rows;
             m += (unsigned long long)units * warps) {{
            const float acc = warp_combine(accumulate(row_base(m), lane, 32u));
            if (lane == 0u) finish(m, acc);
        }}
    }} else {{
        // A block per row.
        for (unsigned long long m = unit; m < rows; m += units) {{
            float acc = warp_combine(accumulate(row_base(m), threadIdx.x, blockDim.x));
            if (lane == 0u) gpt_partial[warp] = acc;
            __syncthreads();
            if (warp == 0u) {{
                acc = (lane < warps) ? gpt_partial[lane] : init;
                acc = warp_combine(acc);
                if (lane == 0u) finish(m, acc);
            }}
            __syncthreads();
        }}
    }}
}};

const unsigned stages = P[2];
const unsigned ticket = P[3];
const unsigned long long counter = u64at(P + 4);
unsigned pos = {P.HEADER_WORDS}u;
for (unsigned s = 0; s < stages; ++s) {{
    if (pos + 2u > words) return {BAD_STAGE};
    const unsigned* S = P + pos;
    if (s > 0u) {{
        __syncthreads();  // this unit's stores are done before the next stage reads them
        if (s == 1u && ctx.units > 1u) {{
            // Every unit ran stage 0; the last one to get here runs the rest alone.
            if (threadIdx.x == 0u) {{
                __threadfence();
                unsigned long long* c = reinterpret_cast<unsigned long long*>(counter);
                unsigned long long cur = atomicAdd(c, 0ull);
                int last_one = 0;
                while (true) {{
                    const unsigned long long next = ((unsigned)(cur >> 32) == ticket)
                        ? cur + 1ull : (((unsigned long long)ticket << 32) | 1ull);
                    const unsigned long long seen = atomicCAS(c, cur, next);
                    if (seen == cur) {{
                        last_one = ((unsigned)(next & 0xffffffffull) == ctx.units) ? 1 : 0;
                        break;
                    }}
                    cur = seen;
                }}
                // Every unit has counted: free the counter, so that a run of this very
                // program again (a replayed CUDA graph keeps its ticket) counts afresh.
                if (last_one) atomicExch(c, 0ull);
                __threadfence();
                gpt_go_on = last_one;
            }}
            __syncthreads();
            if (!gpt_go_on) return 0;
        }}
    }}
    const unsigned unit = (s == 0u) ? ctx.rank : 0u;
    const unsigned units = (s == 0u) ? ctx.units : 1u;
    const unsigned kind = S[0] & 0xffu;
    if (kind == kPointwise) run_pointwise(S, unit, units);
    else if (kind == kReduce) run_reduce(S, unit, units);
    else return {BAD_STAGE};
    pos += S[1];
}}
return 0;
"""


#: The engine op every tiny-op program runs on. Start an engine with it
#: (``Engine.start(system, ops=(PROGRAM_OP,))``) or let the scheduler install it.
PROGRAM_OP = OpSpec(
    name="torch_program",
    params=(
        ScalarParam(name="prog", dtype="uint64"),  # the program's address (pinned host memory)
        ScalarParam(name="words", dtype="uint32"),
    ),
    # The host rewrites the program's pinned buffer for every task: fetched past the caches.
    body=_program_body("__ldcv(src + q)"),
)

#: Program capacities (words) of the stream kernels. A launch passes the program by
#: value, as a kernel parameter of the smallest capacity that holds it: the driver
#: copies the whole parameter at every launch, so short programs get a short one.
STREAM_CAPACITIES = (1024, P.MAX_WORDS)
#: Threads per block of the stream kernels (the engine's blocks have as many).
STREAM_BLOCK_THREADS = 256


def stream_kernel_name(capacity: int) -> str:
    return f"gpt_program_{capacity}"


def _stream_kernel(capacity: int) -> str:
    # A __grid_constant__ parameter may have its address taken without a local copy:
    # the interpreter reads the program from the parameter space itself.
    return f"""
extern "C" __global__ void __launch_bounds__({STREAM_BLOCK_THREADS})
{stream_kernel_name(capacity)}(const __grid_constant__ GptProgram<{capacity}u> program,
                               unsigned words, unsigned long long failure) {{
    const GptCtx ctx{{blockIdx.x, gridDim.x}};
    const int rc = (words > {capacity}u)
        ? {BAD_LENGTH} : gpt_run(ctx, reinterpret_cast<unsigned long long>(program.w), words);
    if (rc != 0 && threadIdx.x == 0u) {{
        // Pinned host memory, read by the host after a launch or at check(): the
        // ticket, then the code that says there is one.
        volatile unsigned* f = reinterpret_cast<volatile unsigned*>(failure);
        f[1] = program.w[3];
        __threadfence_system();
        f[0] = (unsigned)rc;
    }}
}}
"""


#: The same interpreter as ``PROGRAM_OP``, as ordinary kernels launched on a stream
#: (:class:`~gpuactors.torch.executors.StreamExecutor`): one per capacity.
STREAM_SOURCE = (
    "struct GptCtx { unsigned rank; unsigned units; };\n"
    "template <unsigned kCapacity> struct alignas(16) GptProgram { unsigned w[kCapacity]; };\n"
    "__device__ __forceinline__ int gpt_run(const GptCtx& ctx, unsigned long long prog,\n"
    "                                       unsigned words) {\n"
    f"{_program_body('src[q]')}\n"
    "}\n" + "".join(_stream_kernel(capacity) for capacity in STREAM_CAPACITIES)
)
