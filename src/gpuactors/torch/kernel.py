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
#: math overlap; the instruction is decoded once for all of them). A launch gives each
#: thread one element up to 65,536 (``STREAM_SPREAD``), and 2 per thread let one pass
#: cover the size threshold's 262,144 where 1 took four (the 57-op chain: 62.2 against
#: 99.5 us on an H200); 4 lengthened every step at small sizes.
ELEMENTS_PER_THREAD = 2
#: Loads a thread of a reduction keeps in flight (a partial result each).
ROW_LOADS = 8
#: Failure codes the op returns (``TaskFailed.code``).
BAD_LENGTH = 2
BAD_HEADER = 3
BAD_STAGE = 4


def _opcode_constants() -> str:
    lines = [f"constexpr unsigned kOp_{name} = {code}u;" for name, code in P.OPCODES.items()]
    return "\n".join(lines)


#: Each op's math on one element, in C: ``x`` (and ``y``) its operands, ``p0``..``p2``
#: its parameter words; ``y_imm`` says that ``y`` is a scalar, whose reciprocal the host
#: put in ``p1`` (PyTorch multiplies then); ``rmode`` is the result's rounding (PyTorch
#: truncates a float16 or bfloat16 quotient). ``mx``/``mn`` are std::max/std::min as
#: PyTorch's kernels use them (a NaN first argument stays).
ELEMENT_MATH: dict[str, str] = {
    "neg": "-x",
    "abs": "fabsf(x)",
    "relu": "(x != x) ? x : mx(x, 0.0f)",
    "sigmoid": "1.0f / (1.0f + expf(-x))",
    "tanh": "tanhf(x)",
    "exp": "expf(x)",
    "log": "logf(x)",
    "sqrt": "sqrtf(x)",
    "rsqrt": "rsqrtf(x)",
    "reciprocal": "1.0f / x",
    "sin": "sinf(x)",
    "cos": "cosf(x)",
    "gelu": "x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f))",
    "gelu_tanh": "0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * (x * x * x))))",
    "silu": "x / (1.0f + expf(-x))",
    "softplus": "(x * p0 > p1) ? x : log1pf(expf(x * p0)) / p0",
    "elu": "(x > 0.0f) ? x * p1 : expm1f(x * p2) * p0",  # p0..p2: negcoef, poscoef, negiptcoef
    "leaky_relu": "(x > 0.0f) ? x : x * p0",
    "clamp": "(x != x) ? x : mn(mx(x, p0), p1)",
    "hardsigmoid": "mn(mx(x + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f)",
    "hardswish": "x * mn(mx(x + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f)",
    "copy": "x",
    "log1p": "log1pf(x)",
    "expm1": "expm1f(x)",
    "erf": "erff(x)",
    "floor": "floorf(x)",
    "ceil": "ceilf(x)",
    "trunc": "truncf(x)",
    "round": "rintf(x)",
    "pow_scalar": "pow_scalar(x, p0)",
    "rpow_scalar": "(p0 == 1.0f) ? 1.0f : powf(p0, x)",
    "add": "x + p0 * y",
    "mul": "x * y",
    "div": "x / y",
    "div_trunc": "y_imm ? truncf(x * p1) : truncf(rnd(rmode, x / y))",
    "div_floor": "div_floor(x, y, y_imm, p1)",
    "pow": "powf(x, y)",
    "maximum": "(x != x) ? x : ((y != y) ? y : fmaxf(x, y))",
    "minimum": "(x != x) ? x : ((y != y) ? y : fminf(x, y))",
    "eq": "(x == y) ? 1.0f : 0.0f",
    "ne": "(x != y) ? 1.0f : 0.0f",
    "lt": "(x < y) ? 1.0f : 0.0f",
    "le": "(x <= y) ? 1.0f : 0.0f",
    "gt": "(x > y) ? 1.0f : 0.0f",
    "ge": "(x >= y) ? 1.0f : 0.0f",
}
#: Ops with a third operand, whose cases the interpreter spells out.
THREE_OPERAND_OPS = ("where", "clamp_tensor")


def _math_cases() -> str:
    """The interpreter's switch cases of the ops in :data:`ELEMENT_MATH`: the op is
    decoded once per instruction, and its case runs the math over a thread's elements."""
    missing = set(P.OPCODES) - set(ELEMENT_MATH) - set(THREE_OPERAND_OPS)
    if missing:
        raise AssertionError(f"ops without math: {sorted(missing)}")
    cases = []
    for name, math in ELEMENT_MATH.items():
        operands = "x = a.v[e], y = b.v[e]" if name in P.BINARY_OPS else "x = a.v[e]"
        cases.append(
            f"                case kOp_{name}:\n"
            f"                    for (int e = 0; e < kE; ++e) {{\n"
            f"                        const float {operands};\n"
            f"                        r.v[e] = {math};\n"
            f"                    }}\n"
            f"                    break;"
        )
    return "\n".join(cases)


def _program_body(fetch: str) -> str:
    """The interpreter, with ``fetch`` the expression that reads the program's ``q``-th
    16-byte piece at ``src`` into shared memory."""
    return f"""
// One tiny-op program (gpuactors/torch/program.py; docs/torch.md, "The program format").
constexpr unsigned kMagic = {P.MAGIC}u;
constexpr unsigned kMaxWords = {P.MAX_WORDS}u;
constexpr int kRegs = {P.REGISTERS};
static_assert((kRegs & (kRegs - 1)) == 0, "an operand index is masked to a register");
constexpr int kE = {ELEMENTS_PER_THREAD};
constexpr unsigned kRowLoads = {ROW_LOADS}u;
constexpr int kMaxRank = {P.MAX_RANK};
constexpr unsigned kSkip = {P.OP_SKIP}u, kLoad = {P.OP_LOAD}u, kStore = {P.OP_STORE}u;
constexpr unsigned kContig = {P.MODE_CONTIG}u, kStrided = {P.MODE_STRIDED}u;
constexpr unsigned kPointwise = {P.STAGE_POINTWISE}u, kReduce = {P.STAGE_REDUCE}u;
constexpr unsigned kMean = {P.REDUCE_MEAN}u, kAmax = {P.REDUCE_AMAX}u;
constexpr unsigned kP0 = {P.P0}u, kP1 = {P.P1}u;
{_opcode_constants()}

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

auto pow_scalar = [](float x, float e) -> float {{
    if (e == 0.0f) return 1.0f;
    if (e == 1.0f) return x;
    if (e == 2.0f) return x * x;
    if (e == 3.0f) return x * x * x;
    if (e == 0.5f) return sqrtf(x);
    if (e == -0.5f) return rsqrtf(x);
    if (e == -1.0f) return 1.0f / x;
    if (e == -2.0f) return 1.0f / (x * x);
    return powf(x, e);
}};
// y_imm: y is a scalar, whose reciprocal the host put in p1 (PyTorch multiplies then).
// rmode: the result's rounding (PyTorch truncates a float16 or bfloat16 quotient).
auto div_floor = [&](float x, float y, bool y_imm, float p1) -> float {{
    if (y == 0.0f) return x / y;
    const float mod = fmodf(x, y);
    float div = y_imm ? (x - mod) * p1 : (x - mod) / y;
    if ((mod != 0.0f) && ((y < 0.0f) != (mod < 0.0f))) div -= 1.0f;
    if (div == 0.0f) return copysignf(0.0f, y_imm ? x * p1 : x / y);
    float fl = floorf(div);
    if (div - fl > 0.5f) fl += 1.0f;
    return fl;
}};

// A register's values for a thread's kE elements, moved as one piece (aligned to its
// own size: more would pad every register in local memory).
struct alignas(sizeof(float) * kE) Vals {{
    float v[kE];
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
    // Registers are indexed at run time, so they live in (cached) local memory.
    Vals R[kRegs];
    unsigned crd[kE][kMaxRank];
    for (unsigned long long base = (unsigned long long)unit * blockDim.x + threadIdx.x;
         base < numel; base += G * kE) {{
        unsigned long long idx[kE];
        bool ok[kE];
        for (int e = 0; e < kE; ++e) {{
            idx[e] = base + (unsigned long long)e * G;
            ok[e] = idx[e] < numel;
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
                auto offset = [&](int e) -> long long {{
                    if (mode == kContig) return (long long)idx[e];
                    long long off = 0;
                    if (mode == kStrided) {{
                        for (unsigned d = 0; d < rk; ++d)
                            off += (long long)crd[e][d] * (long long)u64at(strides + 2u * d);
                    }}
                    return off;
                }};
                if (op == kLoad) {{
                    Vals x;
                    for (int e = 0; e < kE; ++e)
                        x.v[e] = ok[e] ? rnd(rmode, ld(ptr, dt, offset(e))) : 0.0f;
                    R[reg] = x;
                }} else {{
                    const Vals x = R[reg];
                    for (int e = 0; e < kE; ++e)
                        if (ok[e]) st(ptr, dt, offset(e), x.v[e]);
                }}
                pc += 3u + (mode == kStrided ? 2u * rk : 0u);
                continue;
            }}
            const unsigned dst = (w0 >> 8) & 0x3fu, rmode = (w0 >> 14) & 3u;
            const unsigned ia = (w0 >> 16) & 0xffu, ib = w0 >> 24;
            const float p0 = __uint_as_float(code[pc + 1]);
            const float p1 = __uint_as_float(code[pc + 2]);
            const float p2 = __uint_as_float(code[pc + 3]);
            // Both operands are read whatever the op and the operand's kind (a scalar's
            // index reads a register, then replaced): no branch between decoding and the
            // op's case. A unary op's second operand is never used.
            auto operand = [&](unsigned which) -> Vals {{
                Vals v = R[which & (unsigned)(kRegs - 1)];
                if (which >= (unsigned)kRegs) {{
                    const float p = which == kP0 ? p0 : (which == kP1 ? p1 : p2);
                    for (int e = 0; e < kE; ++e) v.v[e] = p;
                }}
                return v;
            }};
            // The op is decoded once per instruction, not per element: each case runs its
            // math over the thread's elements.
            const Vals a = operand(ia);
            const Vals b = operand(ib);
            Vals r;
            const bool y_imm = ib >= (unsigned)kRegs;
            switch (op) {{
{_math_cases()}
                case kOp_where: {{
                    // WHERE keeps its condition register in p0's word.
                    const Vals c = R[code[pc + 1]];
                    for (int e = 0; e < kE; ++e) r.v[e] = (c.v[e] != 0.0f) ? a.v[e] : b.v[e];
                    break;
                }}
                case kOp_clamp_tensor: {{
                    // PyTorch's clamp with tensor bounds: a NaN anywhere wins, in this order.
                    const Vals hi = R[code[pc + 1]];
                    for (int e = 0; e < kE; ++e) {{
                        const float x = a.v[e], lo = b.v[e];
                        float v = mn(mx(x, lo), hi.v[e]);
                        if (hi.v[e] != hi.v[e]) v = hi.v[e];
                        if (lo != lo) v = lo;
                        if (x != x) v = x;
                        r.v[e] = v;
                    }}
                    break;
                }}
                default: r = a;  // (every opcode has a case)
            }}
            if (rmode != 0u) {{
                for (int e = 0; e < kE; ++e) r.v[e] = rnd(rmode, r.v[e]);
            }}
            R[dst] = r;
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
    // The same over a whole contiguous float32 row at b, 16 bytes a load where the row
    // starts on a 16-byte boundary: a long row is reduced by one unit, whose loads in
    // flight then cover four times the elements.
    auto accumulate_quads = [&](long long b) -> float {{
        const float* first = reinterpret_cast<const float*>(iptr) + b;
        const float4* row = reinterpret_cast<const float4*>(first);
        const unsigned quads = len / 4u, stride = blockDim.x;
        float part[kRowLoads];
        for (unsigned e = 0; e < kRowLoads; ++e) part[e] = init;
        auto take = [&](float p, float4 v) -> float {{
            return combine(combine(p, v.x), combine(combine(v.y, v.z), v.w));
        }};
        unsigned q = threadIdx.x;
        for (; q + (kRowLoads - 1u) * stride < quads; q += kRowLoads * stride) {{
            float4 v[kRowLoads];
            for (unsigned e = 0; e < kRowLoads; ++e) v[e] = __ldcg(row + q + e * stride);
            for (unsigned e = 0; e < kRowLoads; ++e) part[e] = take(part[e], v[e]);
        }}
        for (; q < quads; q += stride) part[0] = take(part[0], __ldcg(row + q));
        for (unsigned r = 4u * quads + threadIdx.x; r < len; r += stride)
            part[0] = combine(part[0], ld(iptr, idt, b + (long long)r));
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
            const long long b = row_base(m);
            const unsigned long long at = iptr + 4ull * (unsigned long long)b;
            const bool quads = idt == 0u && last == 1 && (at & 15ull) == 0ull;
            float acc = quads ? accumulate_quads(b) : accumulate(b, threadIdx.x, blockDim.x);
            acc = warp_combine(acc);
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
                const unsigned long long mine = (unsigned long long)ticket << 32;
                // The counter holds the ticket and the units counted so far. The first
                // unit finds it free (0) and claims it; the others' claim fails once and
                // they count with an atomic add: units retrying a compare-and-swap until
                // it succeeds would queue behind each other, one round trip each.
                unsigned long long seen = atomicCAS(c, 0ull, mine | 1ull);
                unsigned counted = 1u;
                if (seen != 0ull && (seen & ~0xffffffffull) == mine) {{
                    counted = (unsigned)(atomicAdd(c, 1ull) & 0xffffffffull) + 1u;
                }} else if (seen != 0ull) {{
                    // Another ticket's count, left by a run that never finished: claim
                    // it for this one (every unit of this run that sees it does so until
                    // one has).
                    while (true) {{
                        const unsigned long long next =
                            ((seen & ~0xffffffffull) == mine) ? seen + 1ull : (mine | 1ull);
                        const unsigned long long was = atomicCAS(c, seen, next);
                        if (was == seen) {{
                            counted = (unsigned)(next & 0xffffffffull);
                            break;
                        }}
                        seen = was;
                    }}
                }}
                const int last_one = (counted == ctx.units) ? 1 : 0;
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
