"""A same-shape stand-in of a GGUF model: its real header, random well-formed tensor data.

For benchmarks on a machine the real weights cannot reach: the engine's speed depends on the shapes
and quant types, not on the values. Usage:
    python tools/make_standin.py header MODEL.gguf OUT.header      # keep only the header (small)
    python tools/make_standin.py expand OUT.header OUT.gguf        # header + random tensor data
"""

import random
import struct
import sys

from webgguf.gguf import parse_header, read_header

# Byte offsets of the f16 scale fields in one block, by type: they must be finite.
F16_FIELDS = {
    "F16": (),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def random_tensor(type_name: str, type_bytes: int, n_blocks: int, rng: random.Random) -> bytes:
    if type_name == "F32":
        return struct.pack(f"<{n_blocks}f", *(rng.gauss(1.0, 0.1) for _ in range(n_blocks)))
    if type_name not in F16_FIELDS:
        raise SystemExit(f"no stand-in data for {type_name}")
    data = bytearray(rng.randbytes(type_bytes * n_blocks))
    scale = struct.pack("<e", 0.002)
    for block in range(0, len(data), type_bytes):
        for field in F16_FIELDS[type_name]:
            data[block + field : block + field + 2] = scale
    return bytes(data)


def main() -> None:
    command, src, dst = sys.argv[1:4]
    if command == "header":
        header = read_header(src)
        with open(src, "rb") as f, open(dst, "wb") as out:
            out.write(f.read(header.data_offset))
        return
    raw = open(src, "rb").read()
    header = parse_header(raw)
    rng = random.Random(0)
    with open(dst, "wb") as out:
        out.write(raw)
        for info in header.tensors.values():  # file order: offsets ascend
            out.write(bytes(info.offset - out.tell()))
            n_blocks = info.n_elements // info.type.block_elems
            out.write(random_tensor(info.type.name, info.type.block_bytes, n_blocks, rng))


if __name__ == "__main__":
    main()
