"""What every fuzz target shares: the seed corpus, a hard memory bound, and the libFuzzer entry point.

A target script is a libFuzzer binary: `python fuzz/fuzz_gguf.py [CORPUS_DIR ...] [-flag=value ...]`
takes libFuzzer's flags (-runs, -max_total_time, -timeout, -rss_limit_mb, ...). An empty (or missing)
corpus directory is filled with the target's seeds first, so a run never starts from nothing; given
files instead, it replays them (or minimizes one, with -minimize_crash=1).
"""

import os
import resource
import shlex
import sys
import tempfile
import types
from pathlib import Path

import atheris

# Address space a single input may add on top of what the target holds after setup. libFuzzer's
# -malloc_limit_mb needs a sanitizer's malloc hooks, which a Python process lacks, and -rss_limit_mb
# only samples RSS once a second; an address-space limit turns any bigger allocation into a
# MemoryError at once, which fails the run like any other unexpected exception.
HEADROOM_BYTES = 1 << 30


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _write_seeds(corpus: Path, seeds: list[bytes]) -> None:
    for i, seed in enumerate(seeds):
        (corpus / f"seed-{i:04d}").write_bytes(seed)


def fuzz(test_one_input, seeds: list[bytes]) -> None:
    """Run libFuzzer on test_one_input with the command line's flags and corpus directories."""
    # libFuzzer runs argv[0] through the shell for -minimize_crash and -fork: make it run this script
    argv = [f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(sys.argv[0]).resolve()))}", *sys.argv[1:]]
    paths = [Path(arg) for arg in argv[1:] if not arg.startswith("-")]
    if not paths:
        paths = [Path(tempfile.mkdtemp(prefix="webgguf-fuzz-"))]
        argv.append(str(paths[0]))
    corpora = [path for path in paths if not path.is_file()]  # files are inputs to replay or minimize
    for corpus in corpora:
        corpus.mkdir(parents=True, exist_ok=True)
        if not any(corpus.iterdir()):
            _write_seeds(corpus, seeds)

    limited = False

    def bounded_test_one_input(data: bytes) -> None:
        nonlocal limited
        if not limited:  # set at the first input: libFuzzer's own threads and buffers exist by then
            limit = _address_space_bytes() + HEADROOM_BYTES
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            limited = True
        test_one_input(data)

    atheris.Setup(argv, bounded_test_one_input)
    atheris.Fuzz()


def instrument_module(module: types.ModuleType, skip: frozenset[str] = frozenset()) -> None:
    """Add coverage feedback to the functions and methods a module defines, but those named in skip
    (by qualified name). atheris.instrument_imports cannot leave a function out."""
    functions = []
    for value in vars(module).values():
        members = vars(value).values() if isinstance(value, type) else [value]
        functions += [f for f in members if isinstance(f, types.FunctionType)]
    for function in functions:
        if function.__module__ == module.__name__ and function.__qualname__ not in skip:
            atheris.instrument_func(function)


def text_of(data: bytes) -> str:
    """Fuzz bytes as text: UTF-8 where valid (encoded lone surrogates kept), else with U+FFFD."""
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")


def has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
