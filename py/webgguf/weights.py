"""Weights on the GPU: the repacked layout of every GGUF format the kernels read (docs/GPU.md "Weights
on the GPU"), matrices split into parts that each fit one storage binding, and their upload: GGUF
bytes staged, then repacked by a kernel (shaders/repack.wgsl), never copied into Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu.base import STORAGE, UNIFORM, Buffer, BufferRange, Plan
from .pipelines import Pipelines
from .quants import TYPE_BY_NAME

WEIGHT_TYPES = (
    *("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"),  # blocks of 32 (or single values)
    *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"),  # super-blocks of 256
)


def weight_row_bytes(type_name: str, n_in: int) -> dict[int, int]:
    """Bytes per weight row of each GPU array, by binding number (3 quants, 4 scales, 5 high bits)."""
    nb = n_in // 32  # blocks of 32 (of super-block formats: their chunks of 32)
    ns = n_in // 256  # super-blocks (K-quants, IQ4_XS)
    scale_pairs = 4 * ((nb + 1) // 2)  # one u32 per two f16 scales of a row
    return {
        "F32": {3: 4 * n_in},
        "F16": {3: 2 * n_in},
        "Q8_0": {3: 32 * nb, 4: scale_pairs},
        "Q4_0": {3: 16 * nb, 4: scale_pairs},
        "Q4_1": {3: 16 * nb, 4: 4 * nb},
        "Q5_0": {3: 16 * nb, 4: scale_pairs, 5: 4 * nb},
        "Q5_1": {3: 16 * nb, 4: 4 * nb, 5: 4 * nb},
        "IQ4_NL": {3: 16 * nb, 4: scale_pairs},
        # Super-block formats, per super-block: quants, scales (packed as in GGUF, with f16 d / dmin),
        # high bits.
        "Q2_K": {3: 64 * ns, 4: 20 * ns},  # 84 bytes, as in GGUF
        "Q3_K": {3: 64 * ns, 4: 16 * ns, 5: 32 * ns},  # 112 (GGUF: 110)
        "Q4_K": {3: 128 * ns, 4: 16 * ns},  # 144, as in GGUF
        "Q5_K": {3: 128 * ns, 4: 16 * ns, 5: 32 * ns},  # 176, as in GGUF
        "Q6_K": {3: 128 * ns, 4: 20 * ns, 5: 64 * ns},  # 212 (GGUF: 210)
        "IQ4_XS": {3: 128 * ns, 4: 8 * ns},  # 136, as in GGUF
    }[type_name]


def _row_multiple(type_name: str) -> int:
    """n_in must be a multiple of this: 8 for F32/F16 (a step of 8 weights), else the block size."""
    return 8 if type_name in ("F32", "F16") else TYPE_BY_NAME[type_name].block_elems


WEIGHT_NAMES = {3: "w_q", 4: "w_s", 5: "w_h"}  # binding number -> name in lib/weights.wgsl


@dataclass(frozen=True)
class WeightPart:
    row_begin: int  # first row of the matrix held by this part
    row_end: int
    arrays: dict[int, Buffer]  # binding number → buffer (rows row_begin..row_end-1 only)

    @property
    def buffers(self) -> dict[str, Buffer]:
        """The arrays by their binding names in lib/weights.wgsl (for Pipelines.dispatch)."""
        return {WEIGHT_NAMES[b]: buffer for b, buffer in self.arrays.items()}

    def n_out(self, gate_up: bool) -> int:
        """Output rows of a dispatch over this part (a [gate; up] part gives one per row pair)."""
        return (self.row_end - self.row_begin) // (2 if gate_up else 1)


@dataclass(frozen=True)
class Weight:
    """A weight matrix on the GPU: n_out rows of n_in, split on row boundaries into parts that each
    fit one storage binding. Kernels take one part per dispatch (gemv/gemm: one dispatch per part
    writing its rows of y; embed: one dispatch per part, each writing the tokens whose row it holds)."""

    name: str
    type_name: str  # GGML type name, one of WEIGHT_TYPES
    n_in: int
    n_out: int
    parts: tuple[WeightPart, ...]

    @property
    def wgsl_format(self) -> str:
        return self.type_name.lower()


@dataclass(frozen=True)
class StackedWeight:
    """A matrix stacked from tensors of different types (gemma3's q, k and v): one Weight per run of
    tensors of one type, each with the output row where its rows go. A linear runs one GEMV / GEMM per
    segment; a single-type stack is a plain Weight."""

    name: str
    segments: tuple[tuple[int, Weight], ...]  # (first output row, weight)

    @property
    def n_out(self) -> int:
        first_row, last = self.segments[-1]
        return first_row + last.n_out

    @property
    def n_in(self) -> int:
        """Inputs per row (every segment's)."""
        return self.segments[0][1].n_in


def raw_row_bytes(type_name: str, n_in: int) -> int:
    """Bytes of one row of n_in elements in the GGUF file."""
    t = TYPE_BY_NAME[type_name]
    return n_in // t.block_elems * t.block_bytes


# ---------------------------------------------------------------- upload

# Raw bytes staged at a time on their way through repack.wgsl: a tensor larger than this is uploaded in
# slices of whole rows, so the staging buffer, alive while a model loads, never holds a 400 MB output
# head (the memory a load peaks at is the weights plus this).
STAGING_BYTES = 32 << 20


def _row_slices(weight: Weight, row_begin: int, n_rows: int):
    """(part, first row, end row) of the rows row_begin .. row_begin + n_rows, within each part and at
    most STAGING_BYTES of GGUF bytes each (at least one row)."""
    step = max(1, STAGING_BYTES // raw_row_bytes(weight.type_name, weight.n_in))
    for part in weight.parts:
        begin, end = max(row_begin, part.row_begin), min(row_begin + n_rows, part.row_end)
        for first in range(begin, end, step):
            yield part, first, min(end, first + step)


class WeightUploads:
    """Creates weights on one backend and fills them from GGUF bytes (repacked on the GPU)."""

    def __init__(self, pipelines: Pipelines):
        self.pipelines = pipelines
        self.backend = pipelines.backend
        self._staging: Buffer | None = None  # raw GGUF bytes on their way through repack.wgsl
        self._repack_params: Buffer | None = None

    def create_weight(
        self, name: str, type_name: str, n_in: int, n_out: int, max_part_bytes: int = 0
    ) -> Weight:
        """Empty GPU arrays for an n_out x n_in matrix, split so each part fits one binding (and the
        raw bytes of a part fit the repack kernel's source binding). Fill with `write_rows`."""
        if type_name not in WEIGHT_TYPES:
            raise ValueError(f"{name}: weight type {type_name} has no GPU kernels (have {WEIGHT_TYPES})")
        multiple = _row_multiple(type_name)
        if n_in % multiple:
            raise ValueError(f"{name}: n_in {n_in} is not a multiple of {multiple} ({type_name})")
        row_bytes = weight_row_bytes(type_name, n_in)
        row_raw = raw_row_bytes(type_name, n_in)
        limit = max_part_bytes or self.backend.limits.max_storage_buffer_binding_size
        rows_per_part = (limit - 4) // max([row_raw, *row_bytes.values()])  # -4: raw padding
        if rows_per_part < 1:
            raise ValueError(f"{name}: one row ({row_raw} bytes) exceeds the binding limit {limit}")
        parts, made = [], []
        try:
            for begin in range(0, n_out, rows_per_part):
                end = min(n_out, begin + rows_per_part)
                arrays = {}
                for binding, size in row_bytes.items():
                    label = f"{name}[{begin}:{end}].{binding}"
                    arrays[binding] = self.backend.create_buffer(label, (end - begin) * size, STORAGE)
                    made.append(arrays[binding])
                parts.append(WeightPart(begin, end, arrays))
        except BaseException:  # out of memory halfway: nothing of this weight stays allocated
            for buffer in made:
                self.backend.destroy_buffer(buffer)
            raise
        return Weight(name, type_name, n_in, n_out, tuple(parts))

    def write_rows(self, weight: Weight, row_begin: int, raw, n_rows: int) -> None:
        """Upload `n_rows` rows in GGUF layout (`raw`: bytes-like) as rows row_begin.. of `weight`:
        float formats are written as they are, block formats staged then repacked on the GPU."""
        raw = memoryview(raw).cast("B")
        row_raw = raw_row_bytes(weight.type_name, weight.n_in)
        if len(raw) != n_rows * row_raw:
            raise ValueError(f"{weight.name}: {len(raw)} bytes for {n_rows} rows of {row_raw}")
        for part, begin, end in _row_slices(weight, row_begin, n_rows):
            chunk = raw[(begin - row_begin) * row_raw : (end - row_begin) * row_raw]
            if weight.type_name in ("F32", "F16"):
                self.backend.write_buffer(part.arrays[3], chunk, (begin - part.row_begin) * row_raw)
            else:
                self._repack(weight, part, chunk, begin - part.row_begin, end - begin)

    async def write_rows_from(self, weight: Weight, row_begin: int, n_rows: int, source, offset: int) -> None:
        """`write_rows` with bytes that never pass through Python (the browser's fetch stream or File):
        `await source.write_to(buffer, buffer_offset, file_offset, size)` copies bytes of the file into
        a GPU buffer (zero-padding a tail that is not a multiple of 4); the rows start at `offset`."""
        row_raw = raw_row_bytes(weight.type_name, weight.n_in)
        for part, begin, end in _row_slices(weight, row_begin, n_rows):
            at, size = offset + (begin - row_begin) * row_raw, (end - begin) * row_raw
            if weight.type_name in ("F32", "F16"):
                await source.write_to(part.arrays[3], (begin - part.row_begin) * row_raw, at, size)
            else:
                await source.write_to(self._staging_for(size), 0, at, size)
                self._repack_staged(weight, part, begin - part.row_begin, end - begin)

    def upload_weight(
        self, name: str, type_name: str, n_in: int, n_out: int, raw, max_part_bytes: int = 0
    ) -> Weight:
        weight = self.create_weight(name, type_name, n_in, n_out, max_part_bytes)
        self.write_rows(weight, 0, raw, n_out)
        return weight

    def release_upload_buffers(self) -> None:
        """Free the buffers that uploads keep for the next upload (call when loading is done)."""
        for buffer in (self._staging, self._repack_params):
            if buffer is not None:
                self.backend.destroy_buffer(buffer)
        self._staging = self._repack_params = None

    def _repack(self, weight: Weight, part: WeightPart, raw: memoryview, local_row: int, n_rows: int) -> None:
        staging = self._staging_for(len(raw))
        aligned = len(raw) // 4 * 4  # write_buffer takes multiples of 4 bytes: pad the tail only
        self.backend.write_buffer(staging, raw[:aligned])
        if aligned < len(raw):
            self.backend.write_buffer(staging, bytes(raw[aligned:]) + bytes(-len(raw) % 4), aligned)
        self._repack_staged(weight, part, local_row, n_rows)

    def _staging_for(self, n_bytes: int) -> Buffer:
        """The staging buffer of raw GGUF bytes, grown to hold n_bytes. Reusing it is safe: queue
        writes and submits run in queue order."""
        size = -(-n_bytes // 4) * 4
        if self._staging is None or self._staging.size < size:
            if self._staging is not None:
                self.backend.destroy_buffer(self._staging)
            self._staging = self.backend.create_buffer("repack.staging", size, STORAGE)
        return self._staging

    def _repack_staged(self, weight: Weight, part: WeightPart, local_row: int, n_rows: int) -> None:
        """Repack n_rows rows of GGUF blocks at the start of the staging buffer into `part` at local_row."""
        size = -(-n_rows * raw_row_bytes(weight.type_name, weight.n_in) // 4) * 4
        if self._repack_params is None:
            self._repack_params = self.backend.create_buffer("repack.params", 16, UNIFORM)
        kernel = self.pipelines.get("repack", WEIGHTS=weight.wgsl_format)
        block_elems = TYPE_BY_NAME[weight.type_name].block_elems
        n_blocks = n_rows * weight.n_in // block_elems
        src = BufferRange(self._staging, 0, size)
        buffers = {"src": src} | part.buffers
        step = self.pipelines.dispatch(
            kernel,
            f"repack.{weight.name}",
            -(-n_blocks // 64),
            buffers,
            self._repack_params,
            blocks_per_row=weight.n_in // block_elems,
            n_blocks=n_blocks,
            row_begin=local_row,
        )
        self.backend.replay(Plan(f"repack.{weight.name}", (step,)))
