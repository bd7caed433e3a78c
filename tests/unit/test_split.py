"""Split GGUF models (webgguf.gguf_split, llama.cpp's gguf-split format): names, the merged header, the
layout of the shards' bytes, native loading from any shard, and a clear error for every broken set of
files. The shards are written by tools/split_gguf.py (as llama-gguf-split writes them)."""

import asyncio
import json
import os
import random
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from webgguf.gguf import GGUFError, read_header
from webgguf.gguf_split import (
    MAX_SHARDS,
    ShardHeader,
    SplitError,
    merge,
    open_model,
    parse_split_name,
    read_model_header,
    read_sources_header,
    shard_name,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import split_gguf  # noqa: E402

VT = gguf.GGUFValueType


@pytest.fixture
def tiny(tmp_path) -> Path:
    """A small GGUF: metadata and six F32 tensors (of sizes that need padding), alignment 64."""
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_custom_alignment(64)
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    rng = np.random.default_rng(0)
    for i in range(6):
        writer.add_tensor(f"t{i}", rng.standard_normal((i + 1, 5)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def split(source: Path, groups, **kwargs) -> list[Path]:
    return split_gguf.write_shards(source, source.with_name("tiny"), groups, **kwargs)


def shard_headers(paths: list[Path]) -> list[ShardHeader]:
    return [ShardHeader(p.name, os.path.getsize(p), read_header(p)) for p in paths]


GROUPS = [["t0", "t1"], ["t2", "t3", "t4"], ["t5"]]


def test_names_follow_llama_cpp():
    assert shard_name("Qwen2.5-7B-Q4_K_M", 0, 3) == "Qwen2.5-7B-Q4_K_M-00001-of-00003.gguf"
    name = parse_split_name("Qwen2.5-7B-Q4_K_M-00002-of-00003.gguf")
    assert (name.prefix, name.index, name.count) == ("Qwen2.5-7B-Q4_K_M", 1, 3)
    assert name.shard(2) == "Qwen2.5-7B-Q4_K_M-00003-of-00003.gguf"
    for not_a_shard in [
        "model.gguf",
        "-00001-of-00003.gguf",  # no prefix
        "m-00004-of-00003.gguf",  # number past the count
        "m-00000-of-00003.gguf",
        "m-1-of-3.gguf",  # five digits each
        "m-00001-of-00003.gguf.part",
    ]:
        assert parse_split_name(not_a_shard) is None, not_a_shard


def test_a_split_model_reads_as_the_model_from_any_shard(tiny):
    paths = split(tiny, GROUPS)
    assert [p.name for p in paths] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    original = read_header(tiny)
    for path in paths:  # any shard's path finds the others beside it
        header = read_model_header(path)
        assert list(header.tensors) == list(original.tensors)
        assert {k: v for k, v in header.metadata.items() if not k.startswith("split.")} == original.metadata
        assert header.metadata["split.count"] == 3 and header.alignment == 64
    sizes = [p.stat().st_size for p in paths]
    assert [(s.name, s.base, s.size, s.n_tensors) for s in header.shards] == [
        (paths[0].name, 0, sizes[0], 2),
        (paths[1].name, sizes[0], sizes[1], 3),
        (paths[2].name, sizes[0] + sizes[1], sizes[2], 1),
    ]
    raw = tiny.read_bytes()
    joined = b"".join(p.read_bytes() for p in paths)  # the byte sequence: shards end to end
    with open_model(paths[1]) as model:
        for name, info in original.tensors.items():
            data = raw[info.offset : info.offset + info.nbytes]
            assert bytes(model.tensor_bytes(name)) == data
            merged = header.tensors[name]
            assert (merged.shape, merged.type, merged.nbytes) == (info.shape, info.type, info.nbytes)
            assert joined[merged.offset : merged.offset + merged.nbytes] == data


def test_the_layout_follows_the_order_the_files_are_given(tiny):
    """Files dropped on the page come in any order: offsets are in the files laid end to end as given,
    and the tensors and metadata are the model's whatever the order."""
    paths = split(tiny, GROUPS)
    expected = read_model_header(paths[0])
    raw = tiny.read_bytes()
    for seed in range(4):
        order = paths[:]
        random.Random(seed).shuffle(order)
        header = merge(shard_headers(order))
        assert list(header.tensors) == list(expected.tensors) and header.metadata == expected.metadata
        joined = b"".join(p.read_bytes() for p in order)
        for name, info in read_header(tiny).tensors.items():
            merged = header.tensors[name]
            data = raw[info.offset : info.offset + info.nbytes]
            assert joined[merged.offset : merged.offset + merged.nbytes] == data


def test_a_first_shard_with_only_metadata(tiny):
    """gguf-split --no-tensor-first-split: the first file holds the metadata and no tensor."""
    groups = split_gguf.group_tensors(read_header(tiny), max_tensors=4, empty_first=True)
    assert groups[0] == [] and sum(map(len, groups)) == 6
    paths = split(tiny, groups)
    header = read_model_header(paths[0])
    assert list(header.tensors) == [f"t{i}" for i in range(6)] and header.shards[0].n_tensors == 0


def test_the_browser_path_reads_only_headers(tiny):
    """read_sources_header (the worker's path): each file's header through head(n), growing prefixes."""
    paths = split(tiny, GROUPS)

    class Source:  # a JS byte source as Python sees it (gpu/browser.py JsByteSource)
        def __init__(self, path):
            self.name, self.size, self.data = path.name, path.stat().st_size, path.read_bytes()
            self.asked = []

        async def head(self, n):
            self.asked.append(n)
            return self.data[:n]

    sources = [Source(p) for p in paths]
    header = asyncio.run(read_sources_header(sources, first_read=64))
    assert header == read_model_header(paths[0])
    for source, path in zip(sources, paths, strict=True):
        # prefixes grow by doubling from 64 bytes up to what the header needs, not to the whole file
        assert max(source.asked) <= max(64, 2 * read_header(path).data_offset)


# ---- broken sets of files


def with_keys(no=None, count=None, n_tensors=None, types=None):
    """split_kvs for write_shards: the proper keys with some replaced (a function of the shard index)."""
    types = types or {}

    def kvs(index, real_count, real_tensors):
        values = {
            "split.no": index if no is None else no(index),
            "split.count": real_count if count is None else count(index),
            "split.tensors.count": real_tensors if n_tensors is None else n_tensors(index),
        }
        default = {"split.no": VT.UINT16, "split.count": VT.UINT16, "split.tensors.count": VT.INT32}
        return [split_gguf.kv_entry(key, types.get(key, default[key]), v) for key, v in values.items()]

    return kvs


def test_missing_shards_are_named(tiny):
    paths = split(tiny, GROUPS)
    with pytest.raises(SplitError, match=r"shard 2 of 3 missing \(tiny-00002-of-00003.gguf\): give all 3"):
        merge(shard_headers([paths[0], paths[2]]))
    with pytest.raises(SplitError, match=r"shards 2, 3 of 3 missing"):
        merge(shard_headers([paths[0]]))
    paths[1].unlink()
    for path in (paths[0], paths[2]):
        with pytest.raises(SplitError, match=r"1 of the other files are not beside it .*tiny-00002-of-00003"):
            read_model_header(path)
        with pytest.raises(SplitError, match="not beside it"):
            open_model(path)


def test_a_shard_given_twice(tiny):
    paths = split(tiny, GROUPS)
    with pytest.raises(SplitError, match="are both shard 2 of 3"):
        merge(shard_headers([paths[0], paths[1], paths[1]]))


def test_files_of_different_models(tiny, tmp_path):
    paths = split(tiny, GROUPS)
    other = split_gguf.write_shards(tiny, tmp_path / "other", [["t0", "t1", "t2"], ["t3", "t4", "t5"]])
    with pytest.raises(SplitError, match="not one model: tiny-00001-of-00003.gguf is one of 3 shards"):
        merge(shard_headers([paths[0], other[1], paths[2]]))
    with pytest.raises(SplitError, match="tiny.gguf is a model of its own"):
        merge(shard_headers([paths[0], tiny]))


def test_a_tensor_in_two_shards(tiny):
    paths = split(tiny, [["t0", "t1"], ["t1", "t2", "t3", "t4", "t5"]])
    with pytest.raises(SplitError, match="tensor 't1' is in both tiny-00001-of-00002.gguf and tiny-00002"):
        read_model_header(paths[0])


def test_counts_that_disagree(tiny):
    paths = split(tiny, GROUPS, split_kvs=with_keys(n_tensors=lambda i: 5))
    with pytest.raises(SplitError, match="the 3 files hold 6 tensors; split.tensors.count says 5"):
        read_model_header(paths[0])
    paths = split(tiny, GROUPS, split_kvs=with_keys(n_tensors=lambda i: 6 + (i == 2)))
    with pytest.raises(SplitError, match="tiny-00003-of-00003.gguf says the model has 7 tensors"):
        read_model_header(paths[0])
    paths = split(tiny, GROUPS, split_kvs=with_keys(count=lambda i: 3 + (i == 1)))
    with pytest.raises(SplitError, match="is one of 3 shards, tiny-00002-of-00003.gguf one of 4"):
        read_model_header(paths[0])


def test_a_name_that_does_not_match_the_keys(tiny, tmp_path):
    names = ["m-00001-of-00004.gguf", "m-00002-of-00004.gguf", "m-00003-of-00004.gguf"]
    paths = split(tiny, GROUPS, names=names)  # the keys say 3 files
    with pytest.raises(SplitError, match="its name does not end in -00001-of-00003.gguf"):
        read_model_header(paths[0])
    renamed = split(tiny, GROUPS, names=["a.gguf", "b.gguf", "c.gguf"])
    with pytest.raises(SplitError, match="a.gguf is shard 1 of a model in 3 files, but its name"):
        open_model(renamed[0])
    assert list(merge(shard_headers(renamed)).tensors) == [f"t{i}" for i in range(6)]  # given together: fine


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (with_keys(types={"split.count": VT.UINT32}), "split.count is a UINT32, not a UINT16"),
        (with_keys(types={"split.no": VT.INT32}), "split.no is a INT32, not a UINT16"),
        (with_keys(types={"split.tensors.count": VT.UINT32}), "split.tensors.count is a UINT32, not a INT32"),
        (with_keys(count=lambda i: 0), "split.count is 0; a split model has 1 to 256 files"),
        (with_keys(count=lambda i: 65535), f"split.count is 65535; a split model has 1 to {MAX_SHARDS}"),
        (with_keys(no=lambda i: 3 + i), "split.no is 3, but the model has 3 files"),
        (with_keys(n_tensors=lambda i: -1), "split.tensors.count is -1"),
    ],
)
def test_split_keys_are_checked(tiny, keys, message):
    paths = split(tiny, GROUPS, split_kvs=keys)
    with pytest.raises(SplitError, match=message):
        read_model_header(paths[0])
    with pytest.raises(SplitError, match=message):
        merge(shard_headers(paths))


def test_a_split_key_without_the_others(tiny):
    paths = split(tiny, GROUPS, split_kvs=lambda i, n, t: [split_gguf.kv_entry("split.count", VT.UINT16, n)])
    with pytest.raises(SplitError, match="split.count is set but split.no is missing"):
        read_model_header(paths[0])


def test_a_shard_whose_data_is_cut_short(tiny):
    paths = split(tiny, GROUPS)
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[:-16])
    with pytest.raises(GGUFError, match="extends past the end of the file"):
        read_model_header(paths[0])


def test_sizes_are_needed_to_lay_out_the_files(tiny):
    paths = split(tiny, GROUPS)
    shards = shard_headers(paths)
    shards[1] = ShardHeader(shards[1].name, None, shards[1].header)
    with pytest.raises(SplitError, match="the size of tiny-00002-of-00003.gguf is unknown"):
        merge(shards)


def test_one_file_is_a_model_of_one_file(tiny):
    header = read_header(tiny)
    assert merge([ShardHeader("tiny.gguf", None, header)]) is header  # no size needed, no split keys
    assert read_model_header(tiny) == header
    single = split(tiny, [[f"t{i}" for i in range(6)]])[0]  # gguf-split of one file: 00001-of-00001
    assert single.name == "tiny-00001-of-00001.gguf"
    assert list(read_model_header(single).tensors) == list(header.tensors)


def test_kv_entry_is_what_the_gguf_package_reads(tiny):
    paths = split(tiny, GROUPS)
    reader = gguf.GGUFReader(paths[1])
    fields = {name: reader.fields[name] for name in ("split.no", "split.count", "split.tensors.count")}
    assert [f.types[0] for f in fields.values()] == [VT.UINT16, VT.UINT16, VT.INT32]
    assert [int(f.parts[-1][0]) for f in fields.values()] == [1, 3, 6]
    assert struct.unpack("<H", fields["split.no"].parts[-1].tobytes())[0] == 1


# ---- a real model, split, through the CLI: the engine finds the shards beside the first


@pytest.fixture(scope="module")
def smollm2_split(model_path, tmp_path_factory):
    source = model_path("smollm2-135m-instruct")
    groups = split_gguf.group_tensors(read_header(source), max_bytes=40 << 20)
    out = tmp_path_factory.mktemp("split") / "smollm2"
    return source, split_gguf.write_shards(source, out, groups)


def cli_json(capsys, *argv):
    from webgguf.cli import main

    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_runs_a_split_model_as_the_file(smollm2_split, capsys):
    source, paths = smollm2_split
    assert len(paths) == 3
    info = cli_json(capsys, "inspect", str(paths[0]), "--json")
    assert info["tensors"] == cli_json(capsys, "inspect", str(source), "--json")["tensors"]
    argv = ["--prompt", "The capital of France is", "--max-tokens", "6", "--json"]
    whole = cli_json(capsys, "generate", str(source), *argv, "--backend", "gpu")
    assert cli_json(capsys, "generate", str(paths[0]), *argv, "--backend", "gpu") == whole
    argv[3] = "2"  # the numpy reference: a slower model load
    assert (
        cli_json(capsys, "generate", str(paths[2]), *argv, "--backend", "reference")["ids"]
        == whole["ids"][:2]
    )
