"""The numpy reference's results, computed once and kept on disk for the next run.

A result depends only on the model file, the reference code and what was asked, so its key is made of
exactly these: the sha256 of the GGUF file, the sha256 of the package files the reference runs
(REFERENCE_CODE) with numpy's version, and a digest of the request (token ids, positions). Any change
to one of them computes the result again: a stale result cannot be read. Entries live in
build/test-cache/reference/ (git-ignored, removed by `make clean`); when a request is computed again,
its older entries are deleted.
"""

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

import webgguf
from webgguf.models import sha256_file

CACHE_DIR = Path(__file__).resolve().parents[2] / "build" / "test-cache" / "reference"
PACKAGE = Path(webgguf.__file__).resolve().parent
# What ReferenceModel runs: the forward passes, the block formats' dequantization, the GGUF reader and
# the per-architecture configs.
REFERENCE_CODE = ("reference.py", "quants.py", "gguf.py", "arch")

_model_digests: dict[Path, str] = {}


def code_digest() -> str:
    digest = hashlib.sha256(f"numpy {np.__version__}".encode())
    for name in REFERENCE_CODE:
        path = PACKAGE / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(PACKAGE).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def model_digest(path: Path) -> str:
    path = Path(path).resolve()
    if path not in _model_digests:
        _model_digests[path] = sha256_file(path)
    return _model_digests[path]


def cached_arrays(kind: str, model: Path, request, compute: Callable[[], list[np.ndarray]]) -> list:
    """compute(), or what it returned in an earlier run for the same model file, reference code and
    request. kind: a name for the file; request: JSON-able, everything compute() depends on besides
    the model and the code."""
    request_key = hashlib.sha256(json.dumps([kind, request], sort_keys=True).encode()).hexdigest()[:16]
    state_key = hashlib.sha256(f"{model_digest(model)} {code_digest()}".encode()).hexdigest()[:16]
    prefix = f"{kind}-{Path(model).stem}-{request_key}-"
    path = CACHE_DIR / f"{prefix}{state_key}.npz"
    if path.exists():
        with np.load(path) as stored:
            return [stored[f"a{i}"] for i in range(len(stored.files))]
    arrays = [np.asarray(a) for a in compute()]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    for stale in CACHE_DIR.glob(f"{prefix}*.npz"):
        stale.unlink()
    partial = path.with_suffix(f".{os.getpid()}.partial")
    with open(partial, "wb") as f:
        np.savez(f, **{f"a{i}": a for i, a in enumerate(arrays)})
    partial.replace(path)
    return arrays
