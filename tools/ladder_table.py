"""The ladder's ratio table from tools/device_ladder.sh's results: webgguf against llama.cpp CUDA.

    python tools/ladder_table.py RESULTS_DIR

RESULTS_DIR holds gpu.txt, bandwidth.json (tools/bench_bandwidth.py --json), webgguf-NAME.json
(`webgguf bench --json`) and llamacpp-NAME.json (`llama-bench -o json`, flash attention off and on: the
faster of the two is llama.cpp's figure). Prints a Markdown table for docs/PERF.md.
"""

import json
import sys
from pathlib import Path


def llamacpp_rates(path: Path) -> dict[str, float]:
    """{"prefill": tok/s, "decode": tok/s}: the better of llama-bench's flash-attention settings."""
    rates = {"prefill": 0.0, "decode": 0.0}
    for run in json.loads(path.read_text() or "[]"):
        kind = "prefill" if run["n_prompt"] and not run["n_gen"] else "decode"
        rates[kind] = max(rates[kind], float(run["avg_ts"]))
    return rates


def main() -> None:
    results = Path(sys.argv[1])
    gpu = (results / "gpu.txt").read_text().strip() if (results / "gpu.txt").exists() else "?"
    stream = json.loads((results / "bandwidth.json").read_text())["best_gb_s"]
    print(f"Device: {gpu}; streaming read (tools/bench_bandwidth.py): {stream:,.0f} GB/s\n")
    print(
        "| model (stand-in) | weights | decode tok/s: webgguf / llama.cpp "
        "| decode weight reads, % of streaming | prefill-512 tok/s: webgguf / llama.cpp "
        "| webgguf prefill TFLOP/s | peak GPU memory |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    for path in results.glob("webgguf-*.json"):
        try:
            w = json.loads(path.read_text())
        except ValueError:
            continue
        name = path.stem.removeprefix("webgguf-")
        lc_path = results / f"llamacpp-{name}.json"
        lc = llamacpp_rates(lc_path) if lc_path.exists() else {"prefill": 0.0, "decode": 0.0}
        rows.append((w["decode_weight_bytes"], name, w, lc))
    for weight_bytes, name, w, lc in sorted(rows):
        lc_gb_s = weight_bytes * lc["decode"] / 1e9
        print(
            f"| {name} | {weight_bytes / 2**30:.2f} GiB "
            f"| {w['decode_tok_s']:,.0f} / {lc['decode']:,.0f} ({_ratio(w['decode_tok_s'], lc['decode'])}) "
            f"| {w['decode_gb_s']:,.0f} GB/s = {100 * w['decode_gb_s'] / stream:.0f}% "
            f"(llama.cpp {lc_gb_s:,.0f} GB/s = {100 * lc_gb_s / stream:.0f}%) "
            f"| {w['prefill_tok_s']:,.0f} / {lc['prefill']:,.0f} "
            f"({_ratio(w['prefill_tok_s'], lc['prefill'])}) "
            f"| {w['prefill_tflop_s']:.1f} | {w['peak_gpu_bytes'] / 2**30:.2f} GiB |"
        )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


if __name__ == "__main__":
    main()
