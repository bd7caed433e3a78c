"""Build the chat page: Python wheels and runtime files for Pyodide, then `vite build` into web/dist/.

Everything the page loads is served from its own origin (no CDN), so this gathers into web/public/
(git-ignored, copied by Vite into web/dist/):
  pyodide/        the Pyodide runtime from node_modules/pyodide (wasm, stdlib zip, loader, lock file)
  wheels/         pure-Python wheels: webgguf (`pip wheel --no-deps` of this repo), jinja2, markupsafe
                  (a py3-none-any wheel made from its sdist's .py files: its C speedups are optional),
                  micropip; and wheels/index.json naming them
  shaders.json    shaders/**/*.wgsl by relative path (the worker gives them to the engine: source_of)
  bench.html, bench_wllama.html, greedy.html  benchmark and comparison pages (tools/bench_browser.py,
                  tools/page_bench.py, tools/page_parity.py), served as they are
  wllama/         the wllama runtime (npm @wllama/wllama: llama.cpp in wasm) for bench_wllama.html

Downloads (PyPI, through pip) are cached in build/web-cache/, so a rebuild works offline.
jinja2 and markupsafe get the versions installed in this environment, so the browser renders chat
templates with the same code as the native run.

Usage: python tools/build_web.py [--skip-vite]    (needs `npm ci` first, for Pyodide and Vite)
"""

import argparse
import base64
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "web"
PUBLIC = WEB / "public"
CACHE = ROOT / "build" / "web-cache"
PYODIDE_NPM = ROOT / "node_modules" / "pyodide"
# The Pyodide runtime files the page loads (the npm package also holds node-only and debug files).
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
PYODIDE_PYTHON = "3.14"  # the Python version of the pinned Pyodide (npm package pyodide 314.x)
BENCH_PAGES = ("bench.html", "bench_wllama.html", "greedy.html")  # not Vite entries: they import /webgguf.js
WLLAMA_NPM = ROOT / "node_modules" / "@wllama" / "wllama" / "esm"
WLLAMA_FILES = ("index.js", "wasm/wllama.wasm")  # the ES module (its worker inlined) and the wasm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-vite", action="store_true", help="only gather web/public/, no vite build")
    args = parser.parse_args()
    if not (PYODIDE_NPM / "pyodide.asm.wasm").is_file():
        sys.exit("error: node_modules/pyodide is missing: run `npm ci` first")
    copy_pyodide(PUBLIC / "pyodide")
    write_wheels(PUBLIC / "wheels")
    write_shaders(PUBLIC / "shaders.json")
    copy_bench(PUBLIC)
    if not args.skip_vite:
        run(["npx", "--no-install", "vite", "build", "--logLevel", "warn"], cwd=ROOT)
        print(f"built {WEB / 'dist'}")
    return 0


def run(cmd: list[str], cwd: Path = ROOT) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")


def copy_pyodide(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in PYODIDE_FILES:
        shutil.copy2(PYODIDE_NPM / name, dest / name)


def copy_bench(dest: Path) -> None:
    """The benchmark pages, and wllama's runtime for the comparison (a dev dependency: skipped if absent)."""
    for name in BENCH_PAGES:
        shutil.copy2(WEB / name, dest / name)
    if (WLLAMA_NPM / "index.js").is_file():
        (dest / "wllama").mkdir(exist_ok=True)
        for name in WLLAMA_FILES:
            shutil.copy2(WLLAMA_NPM / name, dest / "wllama" / Path(name).name)


def write_wheels(dest: Path) -> None:
    """Our wheel and its dependencies' wheels, plus micropip; index.json lists them in install order."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    jinja2_version = importlib.metadata.version("jinja2")
    markupsafe_version = importlib.metadata.version("markupsafe")
    micropip = download("micropip", binary=True, python=PYODIDE_PYTHON)
    jinja2 = download(f"jinja2=={jinja2_version}", binary=True, python=PYODIDE_PYTHON)
    markupsafe = pure_markupsafe_wheel(download(f"markupsafe=={markupsafe_version}", binary=False))
    ours = build_our_wheel()
    for wheel in (micropip, jinja2, markupsafe, ours):
        shutil.copy2(wheel, dest / wheel.name)
    index = {
        "micropip": micropip.name,  # loaded with pyodide.loadPackage
        "packages": [markupsafe.name, jinja2.name, ours.name],  # installed with micropip, in this order
    }
    (dest / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def download(requirement: str, binary: bool, python: str | None = None) -> Path:
    """A wheel (binary) or sdist of `requirement` from PyPI, cached in build/web-cache/."""
    kind = "wheel" if binary else "sdist"
    cache = CACHE / kind
    cache.mkdir(parents=True, exist_ok=True)
    name, _, version = requirement.partition("==")
    found = _cached(cache, name, version)
    if found:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(cache)]
    cmd += ["--only-binary=:all:", "--python-version", python] if binary else ["--no-binary=:all:"]
    run([*cmd, requirement])
    found = _cached(cache, name, version)
    if not found:
        sys.exit(f"error: pip download {requirement} produced no {kind}")
    return found


def _cached(cache: Path, name: str, version: str) -> Path | None:
    prefix = f"{name.lower().replace('-', '_')}-{version}" if version else f"{name.lower()}-"
    matches = sorted(p for p in cache.iterdir() if p.name.lower().startswith(prefix))
    return matches[-1] if matches else None


def pure_markupsafe_wheel(sdist: Path) -> Path:
    """A py3-none-any wheel of MarkupSafe from its sdist: the package's .py files and py.typed only
    (markupsafe/__init__.py falls back to its pure-Python escape when _speedups is absent)."""
    out_dir = CACHE / "built"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        pkg_info = next(
            m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")
        )
        metadata = tar.extractfile(pkg_info).read()
        version = next(
            line.split(b":", 1)[1].strip().decode()
            for line in metadata.splitlines()
            if line.startswith(b"Version:")
        )
        files = {}
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and "markupsafe" in parts[:-1] and parts[-1].endswith((".py", "py.typed")):
                files["markupsafe/" + parts[-1]] = tar.extractfile(member).read()
    if "markupsafe/__init__.py" not in files:
        sys.exit(f"error: {sdist.name} has no markupsafe/__init__.py")
    dist_info = f"markupsafe-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = metadata
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: webgguf build_web\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    wheel = out_dir / f"markupsafe-{version}-py3-none-any.whl"
    write_wheel(wheel, files, dist_info)
    return wheel


def write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> None:
    """A wheel zip of `files` (archive name → bytes) with its RECORD (sha256 of every file)."""
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(files.items()):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
        zf.writestr(
            zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), "\n".join(record) + "\n"
        )


def build_our_wheel() -> Path:
    out_dir = CACHE / "ours"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out_dir), str(ROOT)]
    )
    wheels = sorted(out_dir.glob("webgguf-*-py3-none-any.whl"))
    if len(wheels) != 1:
        sys.exit(f"error: pip wheel made {[w.name for w in out_dir.iterdir()]}, expected one webgguf wheel")
    return wheels[0]


def write_shaders(dest: Path) -> None:
    shader_dir = ROOT / "shaders"
    sources = {
        p.relative_to(shader_dir).as_posix(): p.read_text() for p in sorted(shader_dir.rglob("*.wgsl"))
    }
    dest.write_text(json.dumps(sources) + "\n")


if __name__ == "__main__":
    sys.exit(main())
