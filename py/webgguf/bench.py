"""`webgguf bench`: prefill and decode speed of the GPU engine, dispatches and CPU time per token.

Numbers only, no assertions: run it on the machine you want to measure. The prompt is real text
tokenized (repeated to length), so the timing includes nothing but the engine.
"""

import time

from .engine import GpuEngine, LoadedModel

BENCH_TEXT = (
    "The history of computing is a story of abstraction: each generation of engineers builds on the "
    "tools of the last, hiding detail behind interfaces so that the next problem can be stated simply. "
)


def prompt_of(model: LoadedModel, n_tokens: int) -> list[int]:
    ids = model.tokenizer.encode(BENCH_TEXT, add_special=False)
    return (ids * (n_tokens // len(ids) + 1))[:n_tokens]


def run_bench(
    model: LoadedModel,
    backend,
    prompt_tokens: int,
    gen_tokens: int,
    repeats: int = 3,
    int8: bool | None = None,
) -> dict:
    """int8: integer dot products for large linears (None: the adapter's default, AdapterCaps.int8)."""
    t0 = time.perf_counter()
    engine = GpuEngine(
        model, backend, n_ctx=prompt_tokens + gen_tokens + 2, max_chunk=min(prompt_tokens, 512), int8=int8
    )
    engine.upload_from_file()
    load_s = time.perf_counter() - t0
    prompt = prompt_of(model, prompt_tokens)
    engine.run_decode(prompt, 2)  # warm-up: compile every pipeline, build the plans

    prefill, decode, cpu = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        engine.run_decode(prompt, 0)  # prefill + the first sampled token, read back
        prefill.append(time.perf_counter() - t)
        t, c = time.perf_counter(), time.process_time()
        engine.run_decode(prompt, gen_tokens)
        total, cpu_total = time.perf_counter() - t, time.process_time() - c
        decode.append(total - prefill[-1])
        cpu.append(cpu_total)
    prefill_s, decode_s, cpu_s = _median(prefill), _median(decode), _median(cpu)
    c = model.config
    weight_bytes, matmul_params = decode_weight_bytes(model), prefill_matmul_params(model)
    return {
        "adapter": backend.adapter_name,
        "model": str(model.path.name),
        "load_s": round(load_s, 3),
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "prefill_tok_s": round(prompt_tokens / prefill_s, 1),
        "decode_tok_s": round(gen_tokens / decode_s, 1),
        "ms_per_token": round(1000 * decode_s / gen_tokens, 3),
        "decode_weight_bytes": weight_bytes,
        "decode_gb_s": round(weight_bytes * gen_tokens / decode_s / 1e9, 1),
        "prefill_tflop_s": round(2 * matmul_params * prompt_tokens / prefill_s / 1e12, 2),
        "dispatches_per_decode_token": engine.dispatches_per_decode_step(),
        "int8": engine.gpu.caps.int8,
        "dispatch_limit": 7 * c.n_layer + 4,
        "python_cpu_ms_per_decode_token": round(1000 * cpu_s / (gen_tokens + 1), 3),
        "peak_gpu_bytes": backend.peak_bytes,
    }


def decode_weight_bytes(model: LoadedModel) -> int:
    """Bytes of weights a decode step reads (as stored in the file): every matrix, except that of the
    token embedding only one row (all of it when it is also the output head)."""
    tied = "output.weight" not in model.header.tensors
    total = 0
    for name, t in model.header.tensors.items():
        if len(t.shape) < 2:
            continue
        if name == "token_embd.weight" and not tied:
            total += t.nbytes // t.shape[1]
        else:
            total += t.nbytes
    return total


def prefill_matmul_params(model: LoadedModel) -> int:
    """Weights that multiply every prompt token: the layers' matrices (the output head runs on the last
    token only, the embedding is a lookup). A prompt of T tokens costs 2 T times this in FLOPs, plus
    attention (not counted)."""
    return sum(
        t.n_elements
        for name, t in model.header.tensors.items()
        if name.startswith("blk.") and len(t.shape) >= 2
    )


def format_bench(r: dict) -> str:
    return "\n".join(
        [
            f"adapter        {r['adapter']}",
            f"model          {r['model']}  (loaded in {r['load_s']} s)",
            f"prefill        {r['prefill_tok_s']} tok/s  ({r['prompt_tokens']} tokens; "
            f"{r['prefill_tflop_s']} TFLOP/s in the layers' matrices)",
            f"decode         {r['decode_tok_s']} tok/s  ({r['ms_per_token']} ms per token, "
            f"{r['gen_tokens']} tokens; weights read at {r['decode_gb_s']} GB/s)",
            f"dispatches     {r['dispatches_per_decode_token']} per decode token "
            f"(limit 7 per layer + 4 = {r['dispatch_limit']})",
            f"python cpu     {r['python_cpu_ms_per_decode_token']} ms per decode token",
            f"peak gpu mem   {r['peak_gpu_bytes'] / 2**20:.1f} MiB allocated by the engine",
        ]
    )


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]
