"""Where a decode step's time goes in the browser (WebGPU on SwiftShader, as tools/bench_browser.py).

The browser backend has no per-dispatch timer (profiling needs timestamp queries), so this times
subsets of the decode plan by wall clock in the worker: each kernel's dispatches replayed alone
(`repeat` times in one submit, then a wait for the queue), the whole step, and an empty submit (the
cost of the wait itself). Decoding moves the state's position on, which the kernels only read.

Usage: python tools/profile_browser.py [--model gemma-3-270m] [--repeat 4] [--json]
           (needs `npm ci` and /usr/bin/chromium; builds the page)
"""

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_browser import CHROMIUM, CHROMIUM_ARGS, PROMPT  # noqa: E402

# Runs in the worker (Pyodide): times kernel subsets of the greedy decode plan.
PROFILE = """
import time, json
import webgguf_worker as w
from webgguf.gpu.base import Dispatch, Plan

backend, engine = w.session.backend, w.session.engine
plan = engine.gpu.decode_plan(True)
REPEAT = {repeat}


async def timed(steps, repeat):
    await backend.synchronize()
    start = time.perf_counter()
    if steps:
        backend.replay(Plan("profile", tuple(steps)), repeat=repeat)
    await backend.synchronize()
    return (time.perf_counter() - start) / repeat


result = {{"empty_submit_ms": 1e3 * await timed([], 1)}}
result["step_ms"] = 1e3 * await timed(list(plan.steps), REPEAT)
groups = {{}}
for step in plan.steps:
    name = step.pipeline.name if isinstance(step, Dispatch) else "copy"
    groups.setdefault(name, []).append(step)
kernels = []
for name, steps in groups.items():
    ms = 1e3 * await timed(steps, REPEAT)
    kernels.append({{"kernel": name, "count": len(steps), "ms": ms}})
result["kernels"] = sorted(kernels, key=lambda k: -k["ms"])
result["sum_of_kernels_ms"] = sum(k["ms"] for k in kernels)
json.dumps(result)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma-3-270m", help="manifest name")
    parser.add_argument("--repeat", type=int, default=4, help="replays of each subset per measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from webgguf.serve import WEB_DIST, make_server

    subprocess.run([sys.executable, "tools/build_web.py"], cwd=ROOT, check=True)
    server = make_server(0, "127.0.0.1", WEB_DIST)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        page.set_default_timeout(1_800_000)
        page.goto(f"{base}/webgguf.js")  # any page of the origin: the engine is imported below
        result = page.evaluate(
            """async ([model, prompt, code]) => {
                const { createEngine } = await import("/webgguf.js");
                const engine = await createEngine({ model });
                const generate = (n) => engine.completions.create({ prompt, max_tokens: n, temperature: 0 });
                await generate(2);  // builds and compiles the plans; the state holds a valid position
                const t0 = performance.now();
                const run = await generate(9);
                const wall = (performance.now() - t0) / 1000;
                const profile = JSON.parse(await engine.runPython(code));
                profile.gpu = engine.gpu;
                profile.decode_tokens_per_second = run.timings.tokens_per_second;
                profile.generate_9_seconds = wall;
                engine.terminate();
                return profile;
            }""",
            [args.model, PROMPT, PROFILE.format(repeat=args.repeat)],
        )
        browser.close()
    server.shutdown()
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"adapter: {json.dumps(result['gpu'])}")
    print(f"decode {result['decode_tokens_per_second']:.2f} tok/s in generate()")
    print(f"empty submit + wait: {result['empty_submit_ms']:.2f} ms")
    print(f"decode step replayed: {result['step_ms']:.1f} ms")
    print(f"each kernel's dispatches replayed alone, {result['sum_of_kernels_ms']:.1f} ms in all:")
    for k in result["kernels"]:
        print(f"  {k['ms']:9.2f} ms {k['count']:4}x  {k['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
