"""The page's engine in Chromium on a GPU, against the native engine and wllama on the same files.

For each GGUF file: native `webgguf bench` (wgpu, same adapter), the page (web/bench.html: navigation →
ready, prefill of a `--prompt-tokens` prompt, decode of `--tokens` greedy tokens, dispatches per token, GPU
memory), and wllama with llama.cpp's WebGPU backend (web/bench_wllama.html, same prompt text and token
count). Each page load gets a fresh Chromium profile (the model comes over loopback, as a first visit),
and a limit: a page that is not ready in time is reported as a stall with what its worker waited on
(engine.stats(), posted every 10 s).

CPU per decode token: the page marks the start and end of each generation (POST /mark); at each mark this
script reads every thread's CPU time of the browser's processes from /proc, so the decode's CPU per token
is (CPU of the 1 + N-token run - CPU of the 1-token run) / N, per process type and thread name
(CrRendererMain: the page's main thread; DedicatedWorker: the engine's worker; CrGpuMain: Chromium's GPU
process, where WebGPU calls are executed).

Linux only (/proc). No dependency beyond the standard library and this repo's `py/` on PYTHONPATH (the
device machine has no numpy for the native run's prompt: it uses webgguf's tokenizer).
tools/device_browser.sh runs it on the lent NVIDIA machine; docs/PERF.md "The page on a GPU" has the results.

Usage: python tools/page_bench.py --chromium PATH [--gpu-flags] [--runs native,page,wllama] [--batch 4,32]
           [--loads N] [--json OUT] MODEL.gguf...
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from webgguf.bench import BENCH_TEXT  # noqa: E402
from webgguf.serve import WEB_DIST, Handler  # noqa: E402

# Chromium's WebGPU on an NVIDIA GPU under Xvfb (not headless: Chrome's headless Vulkan surface needs
# VK_EXT_headless_surface, which the NVIDIA driver lacks). The Dawn toggle turns shader-f16 on.
GPU_FLAGS = [
    "--ozone-platform=x11",
    "--ignore-gpu-blocklist",
    "--enable-features=Vulkan",
    "--use-angle=vulkan",
    "--disable-vulkan-surface",
    "--disable-features=VulkanFromANGLE",
    "--enable-dawn-features=vulkan_enable_f16_on_nvidia",
]
# WebGPU on SwiftShader, headless (as tests/e2e): to try this script on a machine without a GPU.
SWIFTSHADER_FLAGS = [
    "--headless",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
]
COMMON_FLAGS = [
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
]


class Page:
    """What one page load posted: progress lines, CPU marks, the result."""

    def __init__(self):
        self.result = None
        self.done = threading.Event()
        self.marks: list[tuple[str, float, dict]] = []  # (name, time, {(process type, thread): seconds})
        self.log: list[str] = []
        self.browser_pid = None
        self.gpu_mib = None  # GPU memory of the browser's processes at the last mark (nvidia-smi)


def make_handler(page_of):
    class BenchHandler(Handler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode(errors="replace")
            page = page_of()
            if self.path.startswith("/mark"):
                name = json.loads(body)["name"]
                page.marks.append((name, time.perf_counter(), thread_cpu(page.browser_pid)))
                if name.startswith("decode") and name.endswith("end"):
                    page.gpu_mib = gpu_mib(page.browser_pid)
            elif self.path.startswith("/log"):
                page.log.append(body)
                print("  page:", body[:300], file=sys.stderr, flush=True)
            elif self.path.startswith("/result"):
                page.result = json.loads(body)
                page.done.set()
            self.send_response(204)
            self.end_headers()

    return BenchHandler


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def process_type(pid: int) -> str:
    # Chromium rewrites its processes' titles: the arguments may be one space-separated string.
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return "?"
    for arg in args:
        if arg.startswith(b"--type="):
            return arg[7:].decode()
    return "browser"


def thread_cpu(root_pid: int | None) -> dict:
    """CPU seconds of every thread of the browser's processes, by "process type/thread name"."""
    totals: dict[str, float] = {}
    if root_pid is None:
        return totals
    for pid in descendants(root_pid):
        kind = process_type(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                # schedstat: nanoseconds on a CPU (stat's utime/stime count 10 ms ticks)
                ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            key = f"{kind}/{name}"
            totals[key] = totals.get(key, 0.0) + ns / 1e9
    return totals


def gpu_mib(root_pid: int | None) -> float | None:
    if root_pid is None or not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
    ).stdout
    pids = set(descendants(root_pid))
    used = [
        float(line.split(",")[1])
        for line in out.splitlines()
        if line.strip() and int(line.split(",")[0]) in pids
    ]
    return sum(used) if used else None


def decode_cpu_per_token(marks: list, tokens: int) -> dict:
    """Median over runs of (CPU of decode run - CPU of prefill run) / tokens, µs, per thread kind."""
    at = {name: cpu for name, _, cpu in marks}
    runs = sorted({name.split()[1] for name, _, _ in marks if name.startswith("decode")})
    per_run = []
    for r in runs:
        delta = {}
        for key in at.get(f"decode {r} end", {}):
            dec = at[f"decode {r} end"].get(key, 0) - at[f"decode {r} start"].get(key, 0)
            pre = at[f"prefill {r} end"].get(key, 0) - at[f"prefill {r} start"].get(key, 0)
            delta[key] = 1e6 * (dec - pre) / tokens
        per_run.append(delta)
    keys = {k for d in per_run for k in d}
    medians = {k: statistics.median(d.get(k, 0.0) for d in per_run) for k in keys}
    return dict(sorted(((k, round(v, 1)) for k, v in medians.items() if v >= 1.0), key=lambda kv: -kv[1]))


def stop_browser(browser: subprocess.Popen) -> None:
    """End a Chromium process: terminate, and kill it if it has not ended 15 s later."""
    browser.terminate()
    try:
        browser.wait(15)
    except subprocess.TimeoutExpired:
        browser.kill()
        browser.wait(15)


class PageServer:
    """The page and the model files on loopback (webgguf.serve's handler plus the POSTs of make_handler),
    and Chromium opened on one page at a time, each in a fresh profile."""

    def __init__(self, web: Path, models_dir: Path, chromium: str, flags: list[str]):
        self.page = Page()
        self.chromium, self.flags = chromium, flags
        handler = partial(make_handler(lambda: self.page), directory=str(web), models_dir=models_dir)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def open(self, path: str, query: dict, limit: float) -> Page:
        """Open `path?query`; the page's posts until its result, or a stall after `limit` seconds."""
        page = self.page = Page()
        profile = tempfile.mkdtemp(prefix="webgguf-bench-")
        url = f"{self.base}/{path}?{urlencode(query)}"
        args = [self.chromium, *COMMON_FLAGS, *self.flags, f"--user-data-dir={profile}", url]
        log = open(Path(profile).with_suffix(".log"), "w")
        browser = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        page.browser_pid = browser.pid
        started = time.perf_counter()
        if not page.done.wait(limit):
            page.result = {"error": f"no result after {limit:.0f} s (a stall)", "log": page.log[-3:]}
        page.result["wall_seconds"] = round(time.perf_counter() - started, 2)
        stop_browser(browser)
        log.close()
        if "error" in page.result:
            page.result["chromium_log"] = Path(log.name).read_text(errors="replace")[-2000:]
        shutil.rmtree(profile, ignore_errors=True)
        return page

    def close(self) -> None:
        self.server.shutdown()


def native_bench(model: Path, prompt_tokens: int, tokens: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "webgguf.cli",
        "bench",
        str(model),
        "--prompt-tokens",
        str(prompt_tokens),
        "--gen-tokens",
        str(tokens),
        "--json",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "py"), os.environ.get("PYTHONPATH", "")])}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "native bench: no result in 600 s"}
    if out.returncode:
        return {"error": out.stderr[-1500:]}
    return json.loads(out.stdout)


def wllama_prompt(model: Path, prompt_tokens: int) -> str:
    """BENCH_TEXT repeated to about prompt_tokens tokens of this model (wllama takes text)."""
    from webgguf.engine import LoadedModel

    n = len(LoadedModel.open(model).tokenizer.encode(BENCH_TEXT, add_special=False))
    return BENCH_TEXT * max(1, round(prompt_tokens / n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="GGUF files")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument(
        "--swiftshader", action="store_true", help="WebGPU on SwiftShader, headless (no GPU here)"
    )
    parser.add_argument("--runs", default="native,page,wllama", help="which of native, page, wllama")
    parser.add_argument("--batch", default="", help="decode steps per readback to try in the page, e.g. 4,32")
    parser.add_argument("--f16", action="store_true", help="the page with an f16 KV cache")
    parser.add_argument("--loads", type=int, default=1, help="page loads per model and batch")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=float, default=180, help="seconds for one page to post its result")
    parser.add_argument("--web", type=Path, default=WEB_DIST, help="the built page (tools/build_web.py)")
    parser.add_argument("--json", type=Path, help="append one JSON line per run to this file")
    args = parser.parse_args()

    runs = set(args.runs.split(","))
    flags = SWIFTSHADER_FLAGS if args.swiftshader else GPU_FLAGS
    models_dir = args.models[0].resolve().parent
    if any(m.resolve().parent != models_dir for m in args.models):
        sys.exit("error: the models must be in one directory (it is served as /models/)")
    server = PageServer(args.web, models_dir, args.chromium, flags)
    out = open(args.json, "a") if args.json else None

    def emit(record: dict) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    for model in args.models:
        name = model.name
        if "native" in runs:
            emit({"run": "native", "model": name, **native_bench(model, args.prompt_tokens, args.tokens)})
        if "page" in runs:
            for batch in [b for b in args.batch.split(",") if b] or [""]:
                for load in range(args.loads):
                    query = {
                        "model": f"/models/{name}",
                        "text": BENCH_TEXT,
                        "prompt_tokens": args.prompt_tokens,
                        "tokens": args.tokens,
                        "repeats": args.repeats,
                        "report": 1,
                        "ready_limit": args.limit - 30,
                    }
                    if batch:
                        query["batch"] = batch
                    if args.f16:
                        query["f16"] = 1
                    page = server.open("bench.html", query, args.limit)
                    record = {"run": "page", "model": name, "load": load, **page.result}
                    if page.marks:
                        record["cpu_us_per_decode_token"] = decode_cpu_per_token(page.marks, args.tokens)
                        record["gpu_mib_nvidia_smi"] = page.gpu_mib
                    emit(record)
        if "wllama" in runs:
            query = {
                "model": f"/models/{name}",
                "gpu": 1,
                "threads": 1,
                "tokens": args.tokens,
                "prompt": wllama_prompt(model, args.prompt_tokens),
                "report": 1,
                "n_ctx": args.prompt_tokens + args.tokens + 64,
            }
            page = server.open("bench_wllama.html", query, args.limit)
            emit({"run": "wllama", "model": name, **page.result})
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
