"""Decode A/B of shader directories in one process, for kernel changes: one engine per directory,
built side by side on the same device, then alternating runs (a prefill, then `--gen-tokens` decode
steps) so that drift of the machine hits every variant alike.

python tools/bench_shader_dirs.py MODEL LABEL=DIR [LABEL=DIR ...] [--runs 7]

Prints per variant: the decode median (tok/s, ms per token, min and max), prefill, the decode step's
GPU time in one pass (timestamps around a pass holding its dispatches, min of 5), attn_decode's time
per step (one pass per dispatch), and how far its logits after the same tokens are from the first
variant's (a kernel change that alters results shows here).
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from bench_attention import pass_time

import webgguf.pipelines as pipelines
from webgguf import models
from webgguf.bench import prompt_of
from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gpu.base import Dispatch
from webgguf.gpu.native import NativeBackend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("variants", nargs="+", help="LABEL=SHADER_DIR")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=128)
    args = parser.parse_args()
    model = LoadedModel.open(models.resolve(args.model))
    backend = NativeBackend()
    print(backend.adapter_name, flush=True)
    prompt = prompt_of(model, args.prompt_tokens)
    engines, logits = {}, {}
    for variant in args.variants:
        label, shader_dir = variant.split("=", 1)
        pipelines.SHADER_DIR = Path(shader_dir).resolve()  # read when a pipeline is first compiled
        engine = GpuEngine(
            model, backend, n_ctx=args.prompt_tokens + args.gen_tokens + 2, max_chunk=args.prompt_tokens
        )
        engine.upload_from_file()
        engine.run_decode(prompt, 2)  # compiles every pipeline of both plans
        logits[label] = np.frombuffer(backend.read(engine.gpu.act.logits), np.float32).copy()
        engines[label] = engine
    first = logits[next(iter(logits))]
    decode = {label: [] for label in engines}
    prefill = {label: [] for label in engines}
    for _ in range(args.runs):
        for label, engine in engines.items():
            t = time.perf_counter()
            engine.run_decode(prompt, 0)
            p = time.perf_counter() - t
            t = time.perf_counter()
            engine.run_decode(prompt, args.gen_tokens)
            decode[label].append(args.gen_tokens / (time.perf_counter() - t - p))
            prefill[label].append(args.prompt_tokens / p)
    for label, engine in engines.items():
        plan = engine.gpu.decode_plan(True)
        steps = [s for s in plan.steps if isinstance(s, Dispatch)]
        one_pass = min(pass_time(backend, steps, 10) for _ in range(5)) / 10
        attn = min(
            sum(t.seconds for t in backend.profile(plan) if t.kernel.startswith("attn_decode"))
            for _ in range(3)
        )
        d = sorted(decode[label])
        median, pre = statistics.median(d), statistics.median(prefill[label])
        off = np.abs(logits[label] - first).max() / np.abs(first).max()
        print(
            f"{label:10s} decode {median:7.1f} tok/s ({1000 / median:.3f} ms per "
            f"token; min {d[0]:.1f}, max {d[-1]:.1f})  prefill {pre:8.1f} tok/s  "
            f"step GPU in one pass {one_pass * 1e3:.3f} ms  attn_decode {attn * 1e3:.3f} ms per step  "
            f"{engine.dispatches_per_decode_step()} dispatches  logits off by {off:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
