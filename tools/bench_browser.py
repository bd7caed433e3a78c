"""Benchmark webgguf against wllama (llama.cpp in wasm) in the same headless Chromium, on the same GGUF.

Serves the built page with `webgguf serve`'s server (COOP/COEP on, so wllama can use wasm threads)
and opens web/bench.html (webgguf: navigation → ready, prefill and decode speed, dispatches per
token) and web/bench_wllama.html (wllama on the CPU at each thread count). Chromium runs as in
tests/e2e (WebGPU on SwiftShader, Chromium's CPU implementation). Greedy decoding of the same prompt.

Usage: python tools/bench_browser.py [--model smollm2-135m-instruct] [--tokens 32] [--threads 1,2]
           [--json]      (needs `npm ci` and /usr/bin/chromium; builds the page)
"""

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
# As tests/e2e/conftest.py: WebGPU on SwiftShader (Chromium's CPU WebGPU), headless.
CHROMIUM_ARGS = [
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# About 50 tokens, so the prefill speed means something (one prefill chunk for webgguf).
PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a "
    "small notebook in which he recorded the weather, the ships that passed, and the strange lights he "
    "sometimes saw far out at sea. One night"
)
PAGE_TIMEOUT_MS = 1_800_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="manifest name")
    parser.add_argument("--tokens", type=int, default=32, help="tokens to decode (after a warm-up run)")
    parser.add_argument("--threads", default="1,2", help='wllama thread counts, comma-separated ("": none)')
    parser.add_argument("--skip-webgguf", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from webgguf import models
    from webgguf.serve import WEB_DIST, make_server

    subprocess.run([sys.executable, "tools/build_web.py"], cwd=ROOT, check=True)
    model_file = models.ensure(args.model).name
    server = make_server(0, "127.0.0.1", WEB_DIST)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    runs = []
    if not args.skip_webgguf:
        runs.append(("webgguf", "bench.html", {"model": args.model}))
    for threads in [int(t) for t in args.threads.split(",") if t]:  # "": webgguf only
        runs.append((f"wllama cpu x{threads}", "bench_wllama.html", {"threads": threads, "gpu": 0}))
    results = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        for name, page_name, query in runs:
            if page_name == "bench_wllama.html":
                query = {"model": f"/models/{model_file}", **query}
            # bench.html takes the prompt as text repeated to prompt_tokens ids (46: this text's ids once, no
            # BOS), wllama as text; one run each (SwiftShader takes minutes for more).
            query |= {"tokens": args.tokens, "prompt": PROMPT, "text": PROMPT}
            query |= {"prompt_tokens": 46, "repeats": 1}
            page = browser.new_page()
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            page.goto(f"{base}/{page_name}?{urlencode(query)}")
            results[name] = page.evaluate("() => window.benchResult")
            page.close()
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr)
        browser.close()
    server.shutdown()
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print_table(results)
    return 1 if any("error" in r for r in results.values()) else 0


def print_table(results: dict) -> None:
    columns = ("decode_tokens_per_second", "prefill_tokens_per_second", "load_seconds")
    print(f"{'':18} {'decode tok/s':>12} {'prefill tok/s':>13} {'load s':>7}  other")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:18} error: {r['error'].splitlines()[0]}")
            continue
        values = " ".join(f"{r[c]:>{w}.2f}" for c, w in zip(columns, (12, 13, 7), strict=True))
        extra = ""
        if "navigation_to_ready_seconds" in r:
            ready = r["navigation_to_ready_seconds"]
            extra = f"navigation → ready {ready:.1f} s, {r['dispatches_per_token']} dispatches/token"
        elif "threads" in r:
            extra = f"threads {r['threads']} (multithread {r['multithread']})"
        print(f"{name:18} {values}  {extra}")


if __name__ == "__main__":
    sys.exit(main())
