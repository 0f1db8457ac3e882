"""The tiny-op program: what one flushed batch of PyTorch ops becomes on the device.

A program is a flat array of 32-bit words that the engine op ``torch_program``
(:mod:`.kernel`) interprets. It is built while ops are intercepted, one instruction
at a time, so a flush only patches and copies it. Torch-free: CPU tests build
programs from shapes, strides and addresses alone. The layout is documented in
docs/torch.md ("The program format"); :mod:`.reference` is its executable twin.

Layout::

    header   8 words: MAGIC, total words, stages, ticket, counter address (2 words),
             units of stage 0, 0
    stage*   a pointwise stage: [kind | rank << 8 | flags << 16, words, numel (2),
             sizes[rank]], then instructions; or a reduction stage (fixed layout below)

A pointwise stage runs its instructions for every element of its iteration space
(the broadcast output shape), in registers; elements are independent, so any thread
may take any element. Stages run one after another: the first on every unit (block)
of the task, the others on the unit that finishes the first stage last.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

from gpuactors.torch.dtypes import ITEMSIZE

MAGIC = 0x54505447  # "GTPT"
HEADER_WORDS = 8
MAX_WORDS = 4096  # the op's shared-memory copy of the program (16 KiB)
MAX_RANK = 8
REGISTERS = 32

# Stage kinds (low byte of a stage's first word).
STAGE_POINTWISE = 1
STAGE_REDUCE = 2
FLAG_COORDS = 1  # the stage has strided operands: decompose each element's index

# Operand addressing modes (low nibble of a LOAD/STORE's top byte; rank in the high one).
MODE_CONTIG = 0  # element i of the space is element i of the tensor
MODE_SCALAR = 1  # one element, broadcast to all
MODE_STRIDED = 2  # sum of coordinate * stride over the space's dims (0 where broadcast)

# Operand codes above the registers: the instruction's three parameter words.
P0 = 0xFD
P1 = 0xFE
P2 = 0xFF

# Opcodes. SKIP, LOAD and STORE have their own layouts; every other op is an ALU op of
# four words: [op | dst << 8 | a << 16 | b << 24, p0, p1, p2] where dst is the register
# (6 bits) and its rounding (2 bits: none, float16, bfloat16, bool) and a, b are
# operand codes. WHERE keeps its condition register in p0, CLAMP_TENSOR its upper bound.
OP_SKIP = 0
OP_LOAD = 1
OP_STORE = 2
UNARY_OPS = (
    "neg",
    "abs",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "gelu",
    "gelu_tanh",
    "silu",
    "softplus",
    "elu",
    "leaky_relu",
    "clamp",
    "hardsigmoid",
    "hardswish",
    "copy",
    "log1p",
    "expm1",
    "erf",
    "floor",
    "ceil",
    "trunc",
    "round",
    "pow_scalar",
    "rpow_scalar",
)
BINARY_OPS = (
    "add",
    "mul",
    "div",
    "div_trunc",
    "div_floor",
    "pow",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "where",
    "clamp_tensor",
)
OPCODES: dict[str, int] = {name: 16 + i for i, name in enumerate((*UNARY_OPS, *BINARY_OPS))}
ALU_WORDS = 4

# Reductions over the last dimension.
REDUCE_SUM = 0
REDUCE_MEAN = 1
REDUCE_AMAX = 2

_F32 = struct.Struct("<f")


def f32_bits(value: float) -> int:
    """The bits of ``value`` as float32 (rounded to nearest; inf stays inf)."""
    try:
        return int.from_bytes(_F32.pack(value), "little")
    except OverflowError:  # beyond float32: PyTorch's float32 math makes it inf as well
        return 0x7F800000 if value > 0 else 0xFF800000


def as_f32(value: float) -> float:
    """``value`` rounded to float32, back as a Python float."""
    return float(_F32.unpack(f32_bits(value).to_bytes(4, "little"))[0])


def _u64(value: int) -> tuple[int, int]:
    value &= (1 << 64) - 1
    return value & 0xFFFFFFFF, value >> 32


class ProgramFull(Exception):
    """The program has no room for another instruction: flush first."""


class OperandDescriptor:
    """How one tensor is addressed in a stage: its pointer, dtype and mode (and its
    strides over the stage's dims in MODE_STRIDED). Built once per tensor per stage."""

    __slots__ = ("dtype", "mode", "ptr", "strides")

    def __init__(self, ptr: int, dtype: int, mode: int, strides: tuple[int, ...] = ()) -> None:
        self.ptr = ptr
        self.dtype = dtype
        self.mode = mode
        self.strides = strides

    def words(self, op: int, reg_byte: int) -> list[int]:
        rank = len(self.strides) if self.mode == MODE_STRIDED else 0
        lo, hi = _u64(self.ptr)
        head = op | reg_byte << 8 | self.dtype << 16 | (self.mode | rank << 4) << 24
        out = [head, lo, hi]
        for stride in self.strides if self.mode == MODE_STRIDED else ():
            out.extend(_u64(stride))
        return out


def describe(
    ptr: int,
    dtype: int,
    shape: Sequence[int],
    strides: Sequence[int],
    space: Sequence[int],
) -> OperandDescriptor:
    """The descriptor of a tensor read or written over the iteration space ``space``
    (its shape broadcast to ``space``; the caller checked that it broadcasts)."""
    numel = 1
    for size in shape:
        numel *= size
    if numel == 1:
        return OperandDescriptor(ptr, dtype, MODE_SCALAR)
    if tuple(shape) == tuple(space) and is_contiguous(shape, strides):
        return OperandDescriptor(ptr, dtype, MODE_CONTIG)
    return OperandDescriptor(ptr, dtype, MODE_STRIDED, broadcast_strides(shape, strides, space))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major dense (dims of size 1 may have any stride, as in PyTorch)."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """NumPy/PyTorch broadcasting of ``shapes``; None if they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for shape in shapes:
        offset = rank - len(shape)
        for d, size in enumerate(shape):
            current = out[offset + d]
            if size == current or size == 1:
                continue
            if current != 1:
                return None
            out[offset + d] = size
    return tuple(out)


def broadcast_strides(
    shape: Sequence[int], strides: Sequence[int], space: Sequence[int]
) -> tuple[int, ...]:
    """Element strides of a tensor over ``space``: 0 for the dims it is broadcast over
    (missing leading dims and size-1 dims of a larger space dim)."""
    offset = len(space) - len(shape)
    out = [0] * len(space)
    for d, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        if size != 1 or space[offset + d] == 1:
            out[offset + d] = stride if size != 1 else 0
    return tuple(out)


def has_internal_overlap(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether two elements of a tensor may share memory (an expanded tensor, say).
    Conservative: dims sorted by stride must each step past everything the smaller
    ones reach. Writing such a tensor in place is left to PyTorch (which refuses it)."""
    reach = 1  # the smaller dims cover offsets 0 .. reach - 1
    for stride, size in sorted(
        (stride, size) for size, stride in zip(shape, strides, strict=True) if size > 1
    ):
        if stride < reach:
            return True
        reach += (size - 1) * stride
    return False


class PointwiseStage:
    """One pointwise stage under construction: its space, code and registers.

    Registers are handed out from a free list; a value's register comes back when the
    owner says the value can no longer be read (``release``). ``code`` stays a list of
    ints so a flush can turn the store of a tensor that died into a SKIP in place.
    """

    __slots__ = ("code", "coords", "free", "index", "numel", "space")

    def __init__(self, index: int, space: tuple[int, ...]) -> None:
        self.index = index
        self.space = space
        numel = 1
        for size in space:
            numel *= size
        self.numel = numel
        self.code: list[int] = []
        self.free = list(range(REGISTERS - 1, -1, -1))
        self.coords = False

    def take_register(self) -> int:
        """A free register; raises IndexError when none is left."""
        return self.free.pop()

    def release(self, reg: int) -> None:
        self.free.append(reg)

    def load(self, operand: OperandDescriptor, reg: int, round_mode: int = 0) -> None:
        """Emit a LOAD of ``operand`` into register ``reg`` (rounded as asked)."""
        if operand.mode == MODE_STRIDED:
            self.coords = True
        self.code += operand.words(OP_LOAD, reg | round_mode << 6)

    def store(self, operand: OperandDescriptor, reg: int) -> int:
        """Emit a STORE of register ``reg``; returns its position (for ``kill_store``)."""
        if operand.mode == MODE_STRIDED:
            self.coords = True
        position = len(self.code)
        self.code += operand.words(OP_STORE, reg)
        return position

    def kill_store(self, position: int) -> None:
        """Turn the STORE at ``position`` into a SKIP over its words (once)."""
        head = self.code[position]
        if head & 0xFF == OP_SKIP:
            return
        self.code[position] = skip_over(head)

    def alu(
        self,
        op: int,
        dst: int,
        round_mode: int,
        a: int,
        b: int = 0,
        p0: int = 0,
        p1: int = 0,
        p2: int = 0,
    ) -> None:
        """Emit an ALU instruction (``p0``..``p2`` are 32-bit words: f32 bits or a register)."""
        self.code += (op | (dst | round_mode << 6) << 8 | a << 16 | b << 24, p0, p1, p2)

    def words(self) -> list[int]:
        head = STAGE_POINTWISE | len(self.space) << 8 | (FLAG_COORDS if self.coords else 0) << 16
        lo, hi = _u64(self.numel)
        header = [head, 0, lo, hi, *self.space]
        header[1] = len(header) + len(self.code)
        return header + self.code


class ReduceStage:
    """One reduction over the last dim of a tensor (sum, mean or amax), whole."""

    __slots__ = ("index", "numel", "words_")

    def __init__(
        self,
        index: int,
        op: int,
        source: tuple[int, int, Sequence[int], Sequence[int]],
        out_ptr: int,
        out_dtype: int,
    ) -> None:
        ptr, dtype, shape, strides = source
        self.index = index
        length = shape[-1]
        rows = 1
        for size in shape[:-1]:
            rows *= size
        self.numel = rows * length
        in_lo, in_hi = _u64(ptr)
        out_lo, out_hi = _u64(out_ptr)
        rows_lo, rows_hi = _u64(rows)
        body = [
            STAGE_REDUCE | len(shape) << 8 | op << 16,
            0,
            rows_lo,
            rows_hi,
            length,
            out_lo,
            out_hi,
            out_dtype | dtype << 8,
            in_lo,
            in_hi,
            f32_bits(1.0 / length),
            *shape,
        ]
        for stride in strides:
            body.extend(_u64(stride))
        body[1] = len(body)
        self.words_ = body

    @property
    def rows(self) -> int:
        return self.words_[2] | self.words_[3] << 32

    def kill(self) -> None:
        """Reduce no row: the result died unread (its memory may be reused)."""
        self.words_[2] = self.words_[3] = 0

    def words(self) -> list[int]:
        return self.words_


Stage = PointwiseStage | ReduceStage


def assemble(stages: Sequence[Stage], ticket: int, counter: int, units: int) -> list[int]:
    """The program's words: header, then every stage; padded to whole 16-byte lines
    (the op copies it with 16-byte loads). Raises ProgramFull past ``MAX_WORDS``."""
    body: list[int] = []
    for stage in stages:
        body += stage.words()
    lo, hi = _u64(counter)
    words = [MAGIC, 0, len(stages), ticket & 0xFFFFFFFF, lo, hi, units, 0, *body]
    words += [0] * (-len(words) % 4)
    words[1] = len(words)
    if len(words) > MAX_WORDS:
        raise ProgramFull(f"the program has {len(words)} words, the op holds {MAX_WORDS}")
    return words


def instruction_words(head: int) -> int:
    """The length in words of the pointwise instruction whose first word is ``head``."""
    op = head & 0xFF
    if op == OP_SKIP:
        return head >> 8
    if op in (OP_LOAD, OP_STORE):
        return 3 + (2 * (head >> 28) if (head >> 24) & 0xF == MODE_STRIDED else 0)
    return ALU_WORDS


def skip_over(head: int) -> int:
    """The SKIP that steps over the instruction whose first word is ``head``."""
    return OP_SKIP | instruction_words(head) << 8


def without_skips(words: Sequence[int]) -> tuple[list[int], list[int]]:
    """An assembled program without the SKIPs of its pointwise stages, and the new
    position of each of its words (-1 for a word taken out). A program that runs many
    times (a traced one) drops its dead stores once: the interpreter would step over
    each of them on every run, in every thread."""
    old = [int(word) for word in words]
    kept = list(range(HEADER_WORDS))
    stage_starts = []
    at = HEADER_WORDS
    for _ in range(old[2]):
        head, end = old[at], at + old[at + 1]
        stage_starts.append(len(kept))
        if head & 0xFF != STAGE_POINTWISE:
            kept += range(at, end)
        else:
            pc = at + 4 + ((head >> 8) & 0xFF)
            kept += range(at, pc)
            while pc < end:
                length = instruction_words(old[pc])
                if old[pc] & 0xFF != OP_SKIP:
                    kept += range(pc, pc + length)
                pc += length
        at = end
    new = [old[position] for position in kept]
    stage_starts.append(len(new))
    for start, end in itertools.pairwise(stage_starts):
        new[start + 1] = end - start
    new += [0] * (-len(new) % 4)
    new[1] = len(new)
    moved = [-1] * len(old)
    for position, original in enumerate(kept):
        moved[original] = position
    return new, moved


def itemsize(dtype: int) -> int:
    return ITEMSIZE[dtype]
