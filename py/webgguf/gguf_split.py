"""Split GGUF models: llama.cpp's gguf-split format, one model in several GGUF files ("shards").

Names: PREFIX-00001-of-00005.gguf .. PREFIX-00005-of-00005.gguf (the shard's 1-based number and the
count, five digits each: llama.cpp's `llama_split_path`). Every shard is a whole GGUF file with its own
header, the tensor infos of its own tensors and their data. The first shard holds the model's metadata
(and may hold no tensors: gguf-split --no-tensor-first-split); the others hold only the split keys:

  split.no             UINT16  the shard's index, 0-based
  split.count          UINT16  the number of shards
  split.tensors.count  INT32   the number of tensors of the whole model

A file without `split.count` is a model of one file.

A split model reads as one byte sequence: its shards laid end to end in the order they were given
(shard files dropped on the page come in any order). `TensorInfo.offset` of the merged header is an
offset in that sequence, so the weight upload and the browser's byte source (web/sources.js
`SplitSource`) need nothing else; a tensor never runs from one shard into the next.

Checked as llama.cpp checks (src/llama-model-loader.cpp), and more: the split keys have their types,
every shard 0..count-1 is there exactly once, the shards agree on the count and on the number of
tensors, no tensor is in two shards, and the tensors found are the tensors announced. Each shard's
header is bounded by its own size (gguf.parse_header); the number of shards by MAX_SHARDS before any
other file is opened.
"""

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .gguf import GGUFError, GGUFFile, GGUFHeader, GGUFValueType, Shard, read_header, read_header_async

KEY_NO, KEY_COUNT, KEY_TENSORS = "split.no", "split.count", "split.tensors.count"
KEY_TYPES = {KEY_NO: GGUFValueType.UINT16, KEY_COUNT: GGUFValueType.UINT16, KEY_TENSORS: GGUFValueType.INT32}
# More shards than any model a browser or this engine can hold needs (gguf-split's shards are usually
# 2-50 GB); it bounds the files opened and the requests made for one model.
MAX_SHARDS = 256
_NAME = re.compile(r"^(?P<prefix>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")


class SplitError(GGUFError):
    """The files given do not make one split model (a shard missing, twice, or from another model)."""


@dataclass(frozen=True)
class SplitName:
    """What a shard's file name says: PREFIX-{index + 1:05d}-of-{count:05d}.gguf."""

    prefix: str
    index: int  # 0-based
    count: int

    def shard(self, index: int) -> str:
        """The name of shard `index` (0-based) of the same model."""
        return shard_name(self.prefix, index, self.count)


@dataclass(frozen=True)
class SplitKeys:
    """The split keys of one shard."""

    index: int  # split.no
    count: int  # split.count
    n_tensors: int  # split.tensors.count


@dataclass(frozen=True)
class ShardHeader:
    """One shard as read: its name (file name or URL), its size in bytes (None: unknown) and header."""

    name: str
    size: int | None
    header: GGUFHeader


def shard_name(prefix: str, index: int, count: int) -> str:
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def parse_split_name(name: str) -> SplitName | None:
    """The split part of a file name, or None when the name is not a shard's."""
    match = _NAME.match(name)
    if match is None:
        return None
    number, count = int(match["number"]), int(match["count"])
    if not 1 <= number <= count:
        return None
    return SplitName(match["prefix"], number - 1, count)


def split_keys(header: GGUFHeader, name: str) -> SplitKeys | None:
    """The split keys of a shard's header; None for a model of one file (no split.count)."""
    if KEY_COUNT not in header.metadata:
        return None
    for key, wanted in KEY_TYPES.items():
        if key not in header.metadata:
            raise SplitError(f"{name}: {KEY_COUNT} is set but {key} is missing")
        found = header.metadata_types[key]
        if found != wanted:
            found_name = found.name if isinstance(found, GGUFValueType) else "ARRAY"
            raise SplitError(f"{name}: {key} is a {found_name}, not a {wanted.name}")
    keys = SplitKeys(*(header.metadata[key] for key in (KEY_NO, KEY_COUNT, KEY_TENSORS)))
    if not 1 <= keys.count <= MAX_SHARDS:
        raise SplitError(f"{name}: {KEY_COUNT} is {keys.count}; a split model has 1 to {MAX_SHARDS} files")
    if keys.index >= keys.count:
        raise SplitError(f"{name}: {KEY_NO} is {keys.index}, but the model has {keys.count} files (0-based)")
    if keys.n_tensors < 0:
        raise SplitError(f"{name}: {KEY_TENSORS} is {keys.n_tensors}")
    return keys


def merge(shards: list[ShardHeader]) -> GGUFHeader:
    """One header for the model of these files: the first shard's metadata and every shard's tensors,
    their offsets in the byte sequence of the shards laid end to end in the given order. A model of one
    file (no split keys) comes back as it is."""
    if not shards:
        raise SplitError("no files given")
    keys = [split_keys(s.header, s.name) for s in shards]
    if len(shards) == 1 and keys[0] is None:
        return shards[0].header
    if None in keys:
        plain = shards[keys.index(None)].name
        raise SplitError(f"{plain} is a model of its own (no {KEY_COUNT}), not a shard of a split model")
    count = keys[0].count
    for shard, key in zip(shards, keys, strict=True):
        if key.count != count:
            raise SplitError(
                f"the files are not one model: {shards[0].name} is one of {count} shards, "
                f"{shard.name} one of {key.count}"
            )
    by_index: dict[int, int] = {}  # split.no -> position in `shards`
    for position, key in enumerate(keys):
        if key.index in by_index:
            other = shards[by_index[key.index]].name
            raise SplitError(f"{other} and {shards[position].name} are both shard {key.index + 1} of {count}")
        by_index[key.index] = position
    missing = [index for index in range(count) if index not in by_index]
    if missing:
        raise SplitError(_missing_message(shards, missing, count))
    n_tensors = keys[by_index[0]].n_tensors
    for shard, key in zip(shards, keys, strict=True):
        if key.n_tensors != n_tensors:
            raise SplitError(
                f"{shard.name} says the model has {key.n_tensors} tensors, "
                f"{shards[by_index[0]].name} says {n_tensors}"
            )
    if any(s.size is None for s in shards):
        unknown = next(s.name for s in shards if s.size is None)
        raise SplitError(f"the size of {unknown} is unknown; a split model needs the size of every file")
    bases = [sum(s.size for s in shards[:position]) for position in range(len(shards))]
    tensors, holder = {}, {}
    for index in range(count):  # split order: the model's tensor order
        position = by_index[index]
        shard = shards[position]
        for name, info in shard.header.tensors.items():
            if name in tensors:
                raise SplitError(f"tensor {name!r} is in both {holder[name]} and {shard.name}")
            tensors[name] = replace(info, offset=bases[position] + info.offset)
            holder[name] = shard.name
    if len(tensors) != n_tensors:
        raise SplitError(f"the {count} files hold {len(tensors)} tensors; {KEY_TENSORS} says {n_tensors}")
    first = shards[by_index[0]].header
    layout = tuple(
        Shard(s.name, bases[position], s.size, len(s.header.tensors)) for position, s in enumerate(shards)
    )
    return replace(first, tensors=tensors, shards=layout)


def _missing_message(shards: list[ShardHeader], missing: list[int], count: int) -> str:
    numbers = ", ".join(str(index + 1) for index in missing[:8]) + (", ..." if len(missing) > 8 else "")
    message = f"shard{'s' if len(missing) > 1 else ''} {numbers} of {count} missing"
    named = next((n for n in (parse_split_name(_last_segment(s.name)) for s in shards) if n), None)
    if named is not None and named.count == count:
        message += " (" + ", ".join(named.shard(index) for index in missing[:3])
        message += ", ...)" if len(missing) > 3 else ")"
    given = ", ".join(s.name for s in shards[:4]) + (", ..." if len(shards) > 4 else "")
    return f"{message}: give all {count} files of the model (given: {given})"


def _last_segment(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


async def read_sources_header(sources, first_read: int = 4 << 20) -> GGUFHeader:
    """The merged header of a model's files held elsewhere (the browser's byte sources, in the order
    their bytes are laid out): each has `name`, `size` and `await head(n)` (gguf.read_header_async)."""
    shards = []
    for source in sources:
        header = await read_header_async(source.head, source.size, source.name, first_read)
        shards.append(ShardHeader(source.name, source.size, header))
    return merge(shards)


# ---------------------------------------------------------------- native: files beside the first


def shard_paths(path: str | os.PathLike, header: GGUFHeader) -> list[Path]:
    """The files of the model whose file at `path` has `header`: [path] for a model of one file, else
    every shard, found beside it by name (any shard's path will do, as llama.cpp's first-shard rule is
    only about which file holds the metadata)."""
    path = Path(path)
    keys = split_keys(header, path.name)
    if keys is None or keys.count == 1:
        return [path]
    name = parse_split_name(path.name)
    expected = shard_name("PREFIX", keys.index, keys.count)[len("PREFIX") :]
    if name is None or name.index != keys.index or name.count != keys.count:
        raise SplitError(
            f"{path.name} is shard {keys.index + 1} of a model in {keys.count} files, but its name does not "
            f"end in {expected}: the other files cannot be found by name"
        )
    paths = [path.with_name(name.shard(index)) for index in range(keys.count)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        listed = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise SplitError(
            f"{path.name} is shard {keys.index + 1} of {keys.count}; {len(missing)} of the other files are "
            f"not beside it in {path.parent}: {listed}"
        )
    return paths


def read_model_header(path: str | os.PathLike) -> GGUFHeader:
    """The header of the model whose file (or any of whose shards) is at `path`; reads only headers."""
    first = read_header(path)
    paths = shard_paths(path, first)
    if len(paths) == 1:
        return merge([ShardHeader(Path(path).name, os.path.getsize(path), first)])
    return merge([ShardHeader(p.name, os.path.getsize(p), read_header(p)) for p in paths])


class ModelFile:
    """A model's GGUF file, or every shard of a split model, mapped into memory: the merged header and
    zero-copy views of tensor data. Release every tensor_bytes() view before close()."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.files: list[GGUFFile] = []
        try:
            first = GGUFFile(self.path)
            self.files.append(first)
            others = [p for p in shard_paths(self.path, first.header) if p != self.path]
            self.files += [GGUFFile(p) for p in others]
            self.header = merge([ShardHeader(f.path.name, f.size, f.header) for f in self.files])
        except BaseException:
            self.close()
            raise
        self._file_of = {name: f for f in self.files for name in f.header.tensors}

    def tensor_bytes(self, name: str) -> memoryview:
        """The raw (quantized) bytes of tensor `name`, from the shard that holds it."""
        return self._file_of[name].tensor_bytes(name)

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []

    def __enter__(self) -> "ModelFile":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_model(path: str | os.PathLike) -> ModelFile:
    """Map the model at `path`: one GGUF file, or a split model given by any of its shards."""
    return ModelFile(path)
