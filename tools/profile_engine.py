"""Per-kernel GPU time of the decode step and of a prefill chunk (timestamp queries), for docs/PERF.md.

python tools/profile_engine.py MODEL [--prompt-tokens 512] [--leave-out attn_decode gemv_q8 ...]

Per kernel, each dispatch is timed in a pass of its own (launch and drain included each time). Then the
prefill's GPU time in one pass against the engine's wall time for it (split into recording + submits
and the wait for the first token; the plan submitted in parts as the engine does, and in one submit),
and the decode step's dispatches in one pass (as a step runs: each waits for the one before), and the same
with each kernel family of --leave-out left out: what that family costs inside the chain (the outputs
are wrong then; only the time counts). An empty dispatch in such a chain costs ~4.7 us on an H100.
"""

import argparse
import statistics
import time

from bench_attention import pass_time

from webgguf import models
from webgguf.bench import prompt_of
from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gpu import native
from webgguf.gpu.base import Dispatch, time_by_kernel
from webgguf.gpu.native import NativeBackend
from webgguf.sampling import SamplingParams


def show(title: str, times) -> None:
    total = sum(t.seconds for t in times)
    print(f"{title}: {len(times)} dispatches, {total * 1e3:.3f} ms of GPU time (one pass per dispatch)")
    for kernel, (count, seconds) in list(time_by_kernel(times).items())[:16]:
        print(f"  {seconds * 1e3:8.3f} ms  {count:4}x  {kernel}")


def prefill_wall(engine: GpuEngine, prompt: list[int]) -> tuple[float, float]:
    """The engine's prefill as `webgguf bench` times it, in two parts (ms, medians of 5): recording and
    submitting the chunk (GpuEngine._start), then waiting for its first token's read back."""
    starts, waits = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        engine._start(prompt, SamplingParams())
        t1 = time.perf_counter()
        engine.backend.read_async(engine.gpu.act.out_ids).wait()
        starts.append(t1 - t0)
        waits.append(time.perf_counter() - t1)
    return statistics.median(starts) * 1e3, statistics.median(waits) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument(
        "--leave-out",
        nargs="*",
        default=["attn_decode", "attn_merge_q8", "gemv_q8"],
        help="kernel name prefixes: the decode step in one pass without each",
    )
    args = parser.parse_args()
    model = LoadedModel.open(models.resolve(args.model))
    backend = NativeBackend()
    engine = GpuEngine(model, backend, n_ctx=args.prompt_tokens + 8, max_chunk=args.prompt_tokens)
    engine.upload_from_file()
    prompt = prompt_of(model, args.prompt_tokens)
    engine.run_decode(prompt, 2)  # fills the KV cache: the decode step below attends to the whole prompt
    # Each plan is profiled twice and the second shown: a GPU idle before may run the first at low clocks.
    decode = engine.gpu.decode_plan(greedy=True)
    backend.profile(decode)
    show("decode step", backend.profile(decode))
    prefill = engine.gpu.prefill_plan(args.prompt_tokens, True, True)
    backend.profile(prefill)
    show(f"prefill of {args.prompt_tokens} tokens", backend.profile(prefill))

    def one_pass_us(steps) -> float:  # min of 5 passes, each holding the steps 10 times
        return min(pass_time(backend, steps, 10) for _ in range(5)) / 10 * 1e6

    # The prefill's GPU time in one pass against its wall time in the engine (ids written, the plan
    # submitted in parts, the first token read back): what the host adds.
    prefill_steps = [s for s in prefill.steps if isinstance(s, Dispatch)]
    gpu_ms = min(pass_time(backend, prefill_steps, 1) for _ in range(5)) * 1e3
    print(f"prefill of {args.prompt_tokens} tokens in one pass: {gpu_ms:.2f} ms of GPU time")
    for label, first_submit in (("in parts", native.FIRST_SUBMIT_DISPATCHES), ("in one submit", 1 << 30)):
        native.FIRST_SUBMIT_DISPATCHES = first_submit
        start_ms, wait_ms = prefill_wall(engine, prompt)
        print(
            f"  the engine's prefill, submitted {label}: {start_ms + wait_ms:.2f} ms of wall time "
            f"(recording and submits {start_ms:.2f}, then waiting for the first token {wait_ms:.2f}; "
            "medians of 5)"
        )

    steps = [s for s in decode.steps if isinstance(s, Dispatch)]
    print(f"decode step in one pass: {len(steps)} dispatches, {one_pass_us(steps):.0f} us")
    for family in args.leave_out:
        kept = [s for s in steps if not s.pipeline.name.startswith(family)]
        left_out = len(steps) - len(kept)
        print(f"  without {family}* ({left_out} dispatches): {one_pass_us(kept):.0f} us")


if __name__ == "__main__":
    main()
