"""The fuzz targets in fuzz/ each run a bounded number of inputs under libFuzzer (atheris): no unexpected
exception, broken invariant, hang (-timeout) or oversized allocation (address-space and RSS limits).
`make fuzz` runs the same targets for much longer; docs/FUZZING.md says what each target checks."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[2] / "fuzz" / "run.py"
# Inputs per target, 100,000 in all; the tokenizer target is the slowest (~800 inputs/s here).
RUNS = {"gguf": 50_000, "tokenizer": 20_000, "chat": 30_000}
MODELS = {
    "gguf": [],
    "tokenizer": ["smollm2-135m-instruct", "gemma-3-270m"],
    "chat": ["smollm2-135m-instruct"],
}


@pytest.mark.parametrize("target", RUNS)
def test_fuzz_target_runs_clean(target, model_path, tmp_path):
    for name in MODELS[target]:
        model_path(name)  # in the cache before the fuzz process looks for it
    command = [sys.executable, str(RUNNER), target, "--runs", str(RUNS[target]), "--seed", "1"]
    command += ["--artifacts", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    report = result.stdout + result.stderr[-4000:]
    assert result.returncode == 0, report
    runs = int(re.search(rf"fuzz {target}: (\d+) runs", result.stdout).group(1))
    assert runs >= RUNS[target], report
    saved = sorted(path for path in tmp_path.rglob("*") if path.is_file())
    assert not saved, f"failing inputs saved: {saved}"
