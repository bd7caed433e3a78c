"""The table of tools/page_bench.py's results (its --json lines): the page against native and wllama.

Per model: decode and prefill tok/s of native `webgguf bench`, of the page (median over its loads) and
of wllama's WebGPU backend; the page's ratios to both; navigation → ready; dispatches per token; the
page's CPU per decode token in the threads that spend most; GPU memory. Markdown, for docs/PERF.md.

Usage: python tools/page_bench_table.py RESULTS.jsonl
"""

import json
import statistics
import sys
from collections import defaultdict


def main(path: str) -> None:
    runs = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        r = json.loads(line)
        key = r["run"]
        if r["run"] == "page":
            key += "".join([f" batch {r['batch']}" if r.get("batch") else "", " f16" if r.get("f16") else ""])
        runs[r["model"]][key].append(r)
    print(
        "| model | native decode / prefill | page decode / prefill | page / native | wllama-WebGPU decode / "
        "prefill | page / wllama | ready s | dispatches | page CPU µs per decode token | GPU MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, by_run in runs.items():
        native = next((r for r in by_run.get("native", []) if "error" not in r), None)
        wllama = next((r for r in by_run.get("wllama", []) if "error" not in r), None)
        for key in sorted(k for k in by_run if k.startswith("page")):
            ok = [r for r in by_run[key] if "error" not in r]
            stalls = len(by_run[key]) - len(ok)
            if not ok:
                print(f"| {model} ({key}) | | all {stalls} loads failed: {by_run[key][0]['error'][:80]} |")
                continue
            dec = statistics.median(r["decode_tokens_per_second"] for r in ok)
            pre = statistics.median(r["prefill_tokens_per_second"] for r in ok)
            ready = statistics.median(r["navigation_to_ready_seconds"] for r in ok)
            cpu = ok[len(ok) // 2].get("cpu_us_per_decode_token", {})
            top = ", ".join(f"{k} {v:.0f}" for k, v in list(cpu.items())[:3])
            nat = f"{native['decode_tok_s']:,.0f} / {native['prefill_tok_s']:,.0f}" if native else "–"
            vs_nat = (
                f"{dec / native['decode_tok_s']:.2f}× / {pre / native['prefill_tok_s']:.2f}×"
                if native
                else "–"
            )
            wl = "–"
            vs_wl = "–"
            if wllama:
                wl = f"{wllama['decode_tokens_per_second']:,.1f} / {wllama['prefill_tokens_per_second']:,.0f}"
                vs_wl = (
                    f"{dec / wllama['decode_tokens_per_second']:.0f}× / "
                    f"{pre / wllama['prefill_tokens_per_second']:.0f}×"
                )
            elif by_run.get("wllama"):
                wl = "failed: " + by_run["wllama"][0]["error"].splitlines()[0][:60]
            label = model if key == "page" else f"{model} ({key})"
            loads = f" ({len(ok)} loads, {stalls} failed)" if len(by_run[key]) > 1 or stalls else ""
            gpu = ok[0].get("gpu_mib_nvidia_smi")
            print(
                f"| {label}{loads} | {nat} | {dec:,.0f} / {pre:,.0f} | {vs_nat} | {wl} | {vs_wl} | "
                f"{ready:.1f} | {ok[0]['dispatches_per_token']} | {top} | {gpu if gpu is not None else '–'} |"
            )


if __name__ == "__main__":
    main(sys.argv[1])
