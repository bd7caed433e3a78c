"""A same-shape stand-in of a GGUF model: its real header, random well-formed tensor data.

For benchmarks on a machine the real weights cannot reach: the engine's speed depends on the shapes
and quant types, not on the values. Usage:
    python tools/make_standin.py header MODEL.gguf OUT.header      # keep only the header (small)
    python tools/make_standin.py expand OUT.header OUT.gguf        # header + random tensor data (numpy)
The random data is tools/ladder.py's (random bytes, finite f16 scales), which also makes stand-ins of
models whose header cannot be had (the scale ladder).
"""

import sys

from ladder import write_random_tensor

from webgguf.gguf import parse_header, read_header


def main() -> None:
    import numpy as np

    command, src, dst = sys.argv[1:4]
    if command == "header":
        header = read_header(src)
        with open(src, "rb") as f, open(dst, "wb") as out:
            out.write(f.read(header.data_offset))
        return
    raw = open(src, "rb").read()
    header = parse_header(raw)
    rng = np.random.default_rng(0)
    with open(dst, "wb") as out:
        out.write(raw)
        for info in header.tensors.values():  # file order: offsets ascend
            out.write(bytes(info.offset - out.tell()))
            write_random_tensor(out, info.type.name, info.n_elements, rng)


if __name__ == "__main__":
    main()
