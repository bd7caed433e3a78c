"""Per-kernel GPU time of the decode step and of a prefill chunk (timestamp queries), for docs/PERF.md.

python tools/profile_engine.py MODEL [--prompt-tokens 512]
"""

import argparse

from webgguf import models
from webgguf.bench import prompt_of
from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gpu.base import time_by_kernel
from webgguf.gpu.native import NativeBackend


def show(title: str, times) -> None:
    total = sum(t.seconds for t in times)
    print(f"{title}: {len(times)} dispatches, {total * 1e3:.3f} ms of GPU time (one pass per dispatch)")
    for kernel, (count, seconds) in list(time_by_kernel(times).items())[:12]:
        print(f"  {seconds * 1e3:8.3f} ms  {count:4}x  {kernel}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    args = parser.parse_args()
    model = LoadedModel.open(models.resolve(args.model))
    backend = NativeBackend()
    engine = GpuEngine(model, backend, n_ctx=args.prompt_tokens + 8, max_chunk=args.prompt_tokens)
    engine.upload_from_file()
    prompt = prompt_of(model, args.prompt_tokens)
    engine.run_decode(prompt, 2)  # fills the KV cache: the decode step below attends to the whole prompt
    show("decode step", backend.profile(engine.gpu.decode_plan(greedy=True)))
    show(
        f"prefill of {args.prompt_tokens} tokens",
        backend.profile(engine.gpu.prefill_plan(args.prompt_tokens, True, True)),
    )


if __name__ == "__main__":
    main()
