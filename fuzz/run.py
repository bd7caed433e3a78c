"""Run the fuzz targets, one subprocess each, for a number of inputs or a time; exit 1 if any fails.

    python fuzz/run.py --runs 50000 gguf            # a bounded run (what the unit tests do)
    python fuzz/run.py --seconds 200                # every target for 200 s (what `make fuzz` does)

A failing input (an unexpected exception, a broken invariant, a hang past --timeout, memory past
--rss-limit-mb) is saved by libFuzzer as <artifacts>/<target>/crash-*, timeout-* or oom-*; replay it
with `python fuzz/fuzz_<target>.py <that file>`. With --corpus, what each target learns is kept in
<corpus>/<target> and grows from run to run.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
TARGETS = ("gguf", "tokenizer", "chat")
# Largest input per target: a GGUF header with a few tensors; a paragraph of text or ~300 token ids;
# a conversation of a few short messages. Longer inputs only slow the search down.
MAX_LEN = {"gguf": 4096, "tokenizer": 1024, "chat": 1024}
STATS = re.compile(r"^stat::(\w+):\s+(\d+)", re.MULTILINE)


def libfuzzer_flags(args, target: str, artifacts: Path) -> list[str]:
    flags = [
        f"-runs={args.runs}" if args.runs else f"-max_total_time={args.seconds}",
        f"-max_len={MAX_LEN[target]}",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={args.rss_limit_mb}",
        f"-malloc_limit_mb={args.rss_limit_mb}",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
    ]
    if args.seed is not None:
        flags.append(f"-seed={args.seed}")
    return flags


def run_target(args, target: str, corpus: Path) -> bool:
    artifacts = Path(args.artifacts) / target
    artifacts.mkdir(parents=True, exist_ok=True)
    corpus.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(FUZZ_DIR / f"fuzz_{target}.py"), str(corpus)]
    command += libfuzzer_flags(args, target, artifacts)
    env = dict(os.environ)
    if args.seed is not None:
        env["PYTHONHASHSEED"] = str(args.seed)  # string hashes (set order) too: a seeded run repeats exactly
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, errors="replace", env=env)
    seconds = time.monotonic() - start
    stats = {name: int(value) for name, value in STATS.findall(result.stderr)}
    runs = stats.get("number_of_executed_units", 0)
    ok = result.returncode == 0 and (args.seconds or runs >= args.runs)
    print(
        f"fuzz {target}: {runs} runs in {seconds:.1f} s ({stats.get('average_exec_per_sec', 0)} exec/s), "
        f"peak RSS {stats.get('peak_rss_mb', 0)} MB: {'ok' if ok else f'FAILED (exit {result.returncode})'}",
        flush=True,
    )
    if not ok:
        print(result.stderr[-6000:], file=sys.stderr, flush=True)
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("targets", nargs="*", help=f"targets to run (default: all of {', '.join(TARGETS)})")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--runs", type=int, help="inputs to run per target")
    budget.add_argument("--seconds", type=int, help="time to fuzz per target")
    parser.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a fresh one)")
    parser.add_argument("--corpus", help="keep each target's corpus in CORPUS/<target> (default: temporary)")
    parser.add_argument("--artifacts", default="build/fuzz/artifacts", help="where failing inputs go")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-limit-mb", type=int, default=2048, help="memory the whole process may use")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {', '.join(TARGETS)}")

    ok = True
    with tempfile.TemporaryDirectory(prefix="webgguf-fuzz-") as tmp:
        for target in args.targets or TARGETS:
            corpus = Path(args.corpus or tmp) / target
            ok = run_target(args, target, corpus) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
