"""Split a GGUF file into llama.cpp gguf-split shards, as `llama-gguf-split --split` writes them.

    python tools/split_gguf.py MODEL.gguf PREFIX (--max-tensors N | --max-size 40M) [--no-tensor-first-split]

writes PREFIX-00001-of-0000N.gguf ... : the first shard holds the model's metadata, every shard the
split keys (split.no UINT16, split.count UINT16, split.tensors.count INT32), the infos of its tensors
and their data, in the model's tensor order. Split models for the tests (tests/unit/test_split.py,
tests/e2e/test_split.py) and for trying one in the page. The metadata is copied byte for byte; the
tensor infos are written anew (their offsets change).

`write_shards` takes the grouping as given, and `split_kvs` may replace the split keys: the tests make
broken split models with them (a tensor in two shards, wrong counts, wrong key types).
"""

import argparse
import struct
import sys
from collections.abc import Callable
from pathlib import Path

from webgguf.gguf import GGUFValueType as VT
from webgguf.gguf import TensorInfo, open_gguf

DEFAULT_ALIGNMENT = 32


def kv_entry(key: str, vtype: int, value) -> bytes:
    """One metadata entry of a fixed-size scalar type: key string, type, value."""
    formats = {VT.UINT16: "<H", VT.INT32: "<i", VT.UINT32: "<I", VT.INT16: "<h", VT.UINT64: "<Q"}
    raw_key = key.encode()
    key_bytes = struct.pack("<Q", len(raw_key)) + raw_key
    return key_bytes + struct.pack("<I", vtype) + struct.pack(formats[vtype], value)


def split_entries(index: int, count: int, n_tensors: int) -> list[bytes]:
    """The split keys of shard `index` (0-based) as gguf-split writes them."""
    return [
        kv_entry("split.no", VT.UINT16, index),
        kv_entry("split.count", VT.UINT16, count),
        kv_entry("split.tensors.count", VT.INT32, n_tensors),
    ]


def tensor_info_entry(info: TensorInfo, offset: int) -> bytes:
    """One tensor info: name, dims, type, offset of its data in the data section."""
    raw = info.name.encode()
    dims = struct.pack(f"<I{len(info.shape)}Q", len(info.shape), *info.shape)
    return struct.pack("<Q", len(raw)) + raw + dims + struct.pack("<IQ", info.type.id, offset)


def metadata_bytes(data, header) -> bytes:
    """The metadata entries of a file, as they are in it: the bytes between the fixed header (magic,
    version, counts: 24 bytes) and the tensor infos. Where the infos start is found by writing them
    again: they end where the padding before `data_offset` begins."""
    infos = b"".join(tensor_info_entry(t, t.offset - header.data_offset) for t in header.tensors.values())
    for padding in range(header.alignment):
        start = header.data_offset - padding - len(infos)
        if start >= 24 and data[start : start + len(infos)] == infos:
            return bytes(data[24:start])
    raise ValueError("the tensor infos were not found where the header says they end")


def group_tensors(header, max_tensors: int = 0, max_bytes: int = 0, empty_first=False):
    """Tensor names per shard, in file order: a new shard when one would pass `max_tensors` tensors or
    `max_bytes` bytes of data (a shard holds at least one tensor); with `empty_first`, the first shard
    holds only the metadata."""
    groups: list[list[str]] = [[]] if empty_first else []
    current: list[str] = []
    size = 0
    for tensor in header.tensors.values():
        nbytes = -(-tensor.nbytes // DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT
        if current and (
            (max_tensors and len(current) >= max_tensors) or (max_bytes and size + nbytes > max_bytes)
        ):
            groups.append(current)
            current, size = [], 0
        current.append(tensor.name)
        size += nbytes
    groups.append(current)
    return groups


def write_shards(
    source: Path,
    prefix: Path,
    groups: list[list[str]],
    split_kvs: Callable[[int, int, int], list[bytes]] = split_entries,
    names: list[str] | None = None,
) -> list[Path]:
    """Write one shard per group of tensor names (a name may be given twice: the tests need that);
    `split_kvs(index, count, n_tensors)` gives each shard's split entries. Returns the paths."""
    with open_gguf(source) as model:
        header = model.header
        if "split.count" in header.metadata:
            raise SystemExit(f"{source} is already a shard of a split model")
        with open(source, "rb") as f:
            model_kvs = metadata_bytes(f.read(header.data_offset), header)
        n_kv = len(header.metadata)
        n_tensors = sum(len(group) for group in groups)
        count = len(groups)
        paths = []
        for index, group in enumerate(groups):
            name = names[index] if names else f"{prefix.name}-{index + 1:05d}-of-{count:05d}.gguf"
            path = prefix.with_name(name)
            kvs = split_kvs(index, count, n_tensors)
            alignment = header.alignment if index == 0 else DEFAULT_ALIGNMENT  # general.alignment: shard 0
            infos, offset = b"", 0
            for tensor_name in group:
                infos += tensor_info_entry(header.tensors[tensor_name], offset)
                offset += -(-header.tensors[tensor_name].nbytes // alignment) * alignment
            head = b"GGUF" + struct.pack("<IQQ", 3, len(group), (n_kv if index == 0 else 0) + len(kvs))
            head += (model_kvs if index == 0 else b"") + b"".join(kvs) + infos
            with open(path, "wb") as out:
                out.write(head + bytes(-len(head) % alignment))
                for tensor_name in group:
                    out.write(model.tensor_bytes(tensor_name))
                    out.write(bytes(-header.tensors[tensor_name].nbytes % alignment))
            paths.append(path)
    return paths


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("prefix", type=Path, help="output prefix: PREFIX-00001-of-0000N.gguf ...")
    parser.add_argument("--max-tensors", type=int, default=0)
    parser.add_argument("--max-size", type=parse_size, default=0, help="bytes per shard, e.g. 40M")
    parser.add_argument("--no-tensor-first-split", action="store_true", help="the first shard: metadata only")
    args = parser.parse_args(argv)
    if not (args.max_tensors or args.max_size):
        parser.error("give --max-tensors or --max-size")
    with open_gguf(args.model) as model:
        header = model.header
    groups = group_tensors(header, args.max_tensors, args.max_size, args.no_tensor_first_split)
    for path in write_shards(args.model, args.prefix, groups):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
