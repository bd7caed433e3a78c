"""Prefill GEMM speed: the integer-dot path (quantize_q8.wgsl + gemm_q8.wgsl, over a sweep of tile
shapes) against the f32 path (gemm.wgsl, as the engine runs it), at the matrix shapes of the ladder's models.

The shapes are the layers' GEMMs as the engine builds them from tools/ladder.py's recipes (stacked q/k/v
runs of one type, gate/up fused, each type of ffn_down), with random well-formed blocks, for prompts of
T tokens. Per (shape, T, kernel): GPU time from timestamp queries (Backend.profile: one pass per
dispatch, median over --repeats), the quantize dispatch of the GEMM's input counted with the GEMM, and
TOP/s = 2 T rows n_in / time. Every configuration's output is compared once with gemm.wgsl's (8-bit
activations: expect ~0.5% of the largest output; a broken config shows as "WRONG"). The summary adds up
each model's GEMMs per prefill (every layer, the shared quantize counted once per input): with each
shape's best config, and with the one config that is best over all shapes.

    python tools/bench_gemm.py                      # llama-3.1-8b and qwen2.5-7b, T = 512 and 128
    python tools/bench_gemm.py --models llama-3.1-8b --tokens 512 --configs 16x16,8x8
    python tools/bench_gemm.py --quick              # a smoke run with tiny shapes (a CPU adapter will do)
    python tools/bench_gemm.py --json               # one JSON object with every measurement

Configs are written wg_t x wg_n (gemm_q8.wgsl's invocations, each 4 tokens x 8 rows).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ladder  # noqa: E402

from webgguf import ops  # noqa: E402
from webgguf.gpu.base import STORAGE, Plan  # noqa: E402
from webgguf.gpu.native import NativeBackend  # noqa: E402
from webgguf.kernels import Kernels  # noqa: E402
from webgguf.ops.quantized import Q8Activations  # noqa: E402
from webgguf.selection import INT8_WEIGHT_TYPES  # noqa: E402

# Tile shapes to sweep (wg_t x wg_n invocations, each 4 tokens x 8 rows: 4 wg_t tokens by 8 wg_n rows).
CANDIDATES = (
    "16x8",  # 64 tokens x 64 rows, 128 invocations: the engine's for long chunks
    "8x8",  # 32 x 64, 64 invocations: the engine's for short chunks
    "16x16",  # 64 x 128, 256 invocations
    "8x16",  # 32 x 128, 128 invocations
    "32x8",  # 128 x 64, 256 invocations
)
QUICK_CANDIDATES = ("16x8", "8x8")
# gemm.wgsl's tile shapes (the same wg_t x wg_n notation: 4 wg_t tokens by 8 wg_n rows).
F32_CANDIDATES = ("16x8", "8x8", "32x8", "8x16", "16x16")
WRONG = 0.03  # relative to the largest output: far above the 8-bit activations' ~0.5%


def parse_config(text: str) -> tuple[int, int]:
    """(wg_t, wg_n) from "wg_t x wg_n"."""
    wg_t, wg_n = (int(v) for v in text.split("x"))
    return wg_t, wg_n


@dataclass(frozen=True)
class Shape:
    """One GEMM of a layer: rows x n_in of type_name (rows: outputs; 2 x rows read with gate_up)."""

    name: str  # e.g. "attn_qkv[0:]"
    type_name: str
    n_in: int
    rows: int
    norm: bool = False  # reads rmsnorm(x): quantize_q8 NORM_W + gemm_q8 NORM / gemm.wgsl NORM
    gate_up: bool = False
    residual: bool = False
    shares_input: bool = False  # a later segment of a stacked matrix: its input is quantized already

    def __str__(self) -> str:
        epilogue = "+".join(k for k in ("norm", "gate_up", "residual") if getattr(self, k))
        rows = f"2x{self.rows}" if self.gate_up else str(self.rows)
        return f"{self.name} {self.type_name} {self.n_in}->{rows} {epilogue}"

    @property
    def ops(self) -> int:
        """Multiply-adds x 2 per token."""
        return 2 * self.n_in * self.rows * (2 if self.gate_up else 1)


def model_shapes(recipe_name: str) -> Counter[Shape]:
    """The GEMMs of one prefill chunk of a ladder model, with how many layers have each."""
    r = ladder.RECIPES[recipe_name]
    types = ladder.tensor_types(r)
    q_rows, kv_rows = r.n_head * r.head_dim, r.n_head_kv * r.head_dim
    shapes: Counter[Shape] = Counter()
    for i in range(r.n_layer):
        b = f"blk.{i}."
        qkv = [(types[b + "attn_q.weight"], q_rows), (types[b + "attn_k.weight"], kv_rows)]
        qkv.append((types[b + "attn_v.weight"], kv_rows))
        runs: list[list] = []  # runs of one type share a weight (plan.py)
        for type_name, rows in qkv:
            if runs and runs[-1][0] == type_name:
                runs[-1][1] += rows
            else:
                runs.append([type_name, rows])
        first = 0
        for index, (type_name, rows) in enumerate(runs):
            shapes[
                Shape(f"attn_qkv[{first}:]", type_name, r.d_model, rows, norm=True, shares_input=index > 0)
            ] += 1
            first += rows
        shapes[Shape("attn_output", types[b + "attn_output.weight"], q_rows, r.d_model, residual=True)] += 1
        shapes[
            Shape("ffn_gate_up", types[b + "ffn_gate.weight"], r.d_model, r.d_ff, norm=True, gate_up=True)
        ] += 1
        shapes[Shape("ffn_down", types[b + "ffn_down.weight"], r.d_ff, r.d_model, residual=True)] += 1
    return shapes


QUICK_SHAPES = {
    "tiny": Counter(
        {
            Shape("attn_qkv[0:]", "Q4_K", 256, 192, norm=True): 2,
            Shape("attn_output", "Q5_0", 192, 256, residual=True): 2,
            Shape("ffn_gate_up", "Q4_K", 256, 160, norm=True, gate_up=True): 2,
            Shape("ffn_down", "Q6_K", 512, 256, residual=True): 1,
            Shape("ffn_down", "Q8_0", 160, 256, residual=True): 1,
        }
    )
}


# The two small models the tests hold to llama.cpp (their real headers' shapes and types): every linear
# stays f32 in the engine (selection.INT8_MIN_BYTES), so their prefill is gemm.wgsl's.
SMALL_MODELS = {
    "smollm2-135m": Counter(
        {
            Shape("attn_qkv[0:]", "Q4_1", 576, 960, norm=True): 30,
            Shape("attn_output", "Q4_1", 576, 576, residual=True): 30,
            Shape("ffn_gate_up", "Q4_1", 576, 1536, norm=True, gate_up=True): 30,
            Shape("ffn_down", "Q4_1", 1536, 576, residual=True): 30,
        }
    ),
    "gemma-3-270m": Counter(
        {
            Shape("attn_qkv[0:]", "Q5_0", 640, 1280, norm=True): 18,
            Shape("attn_qkv[1280:]", "Q8_0", 640, 256, norm=True, shares_input=True): 9,
            Shape("attn_output", "Q4_K", 1024, 640, residual=True): 18,
            Shape("ffn_gate_up", "Q5_0", 640, 2048, norm=True, gate_up=True): 18,
            Shape("ffn_down", "Q4_K", 2048, 640): 9,
            Shape("ffn_down", "Q6_K", 2048, 640): 9,
        }
    ),
}


def random_weight(kernels: Kernels, shape: Shape, rng):
    n_rows = shape.rows * (2 if shape.gate_up else 1)
    raw = io.BytesIO()
    ladder.write_random_tensor(raw, shape.type_name, n_rows * shape.n_in, rng)
    return kernels.uploads.upload_weight(shape.name, shape.type_name, shape.n_in, n_rows, raw.getbuffer())


class Bench:
    """The buffers of one shape at one token count, and the timed runs of each kernel on them."""

    def __init__(self, kernels: Kernels, shape: Shape, weight, n_tokens: int, rng, repeats: int):
        import numpy as np

        self.np = np
        self.kernels, self.backend, self.shape, self.weight = kernels, kernels.backend, shape, weight
        self.n_tokens, self.repeats = n_tokens, repeats
        n_in = shape.n_in
        x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
        self.x = self.buffer("x", x.nbytes, x.tobytes())
        norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
        self.norm = self.buffer("norm_w", norm.nbytes, norm.tobytes()) if shape.norm else None
        self.q8 = Q8Activations(
            *(
                self.buffer(name, size)
                for name, size in zip(("xq", "xk", "xs"), Q8Activations.sizes(n_tokens, n_in), strict=True)
            )
        )
        self.y_bytes = 4 * n_tokens * shape.rows
        self.y = self.buffer("y", self.y_bytes)
        self.reference = None  # gemm.wgsl's Y, for the check

    def buffer(self, name, size, data=None):
        buf = self.backend.create_buffer(f"bench.{name}", size, STORAGE)
        if data is not None:
            self.backend.write_buffer(buf, data)
        return buf

    def close(self) -> None:
        for buf in (self.x, self.norm, self.q8.xq, self.q8.xk, self.q8.xs, self.y):
            if buf is not None:
                self.backend.destroy_buffer(buf)

    def f32_steps(self, tiles: tuple[int, int] | None = None) -> list:
        s = self.shape
        return ops.gemm(
            self.kernels,
            self.weight,
            self.x,
            self.y,
            self.n_tokens,
            residual=s.residual,
            gate_up=s.gate_up,
            norm=self.norm,
            eps=1e-5,
            tiles=tiles,
        )

    def q8_steps(self, tiles: tuple[int, int]) -> tuple[list, list]:
        s = self.shape
        quantize = [ops.quantize(self.kernels, self.x, self.q8, self.n_tokens, s.n_in, norm=self.norm)]
        gemm = ops.gemm_q8(
            self.kernels,
            self.weight,
            self.q8,
            self.y,
            self.n_tokens,
            tiles=tiles,
            residual=s.residual,
            gate_up=s.gate_up,
            norm=self.norm is not None,
            eps=1e-5,
        )
        return quantize, gemm

    def output(self, steps: list):
        """Y after one run of steps from Y = 0."""
        self.backend.write_buffer(self.y, bytes(self.y_bytes))
        self.backend.replay(Plan("bench.check", tuple(steps)))
        return self.np.frombuffer(self.backend.read(self.y), self.np.float32).astype(self.np.float64)

    def seconds(self, steps: list) -> float:
        """Median over the repeats of the summed GPU time of steps."""
        times = self.backend.profile(Plan("bench", tuple(steps) * self.repeats))
        per_run = len(times) // self.repeats
        return statistics.median(
            sum(t.seconds for t in times[i : i + per_run]) for i in range(0, len(times), per_run)
        )

    def error(self, got) -> float:
        """The largest difference from gemm.wgsl's Y, relative to its largest output."""
        scale = float(self.np.max(self.np.abs(self.reference))) or 1.0
        return float(self.np.max(self.np.abs(got - self.reference))) / scale

    def run_f32(self) -> dict:
        """gemm.wgsl as the engine chooses it: the reference the other configs are checked against."""
        steps = self.f32_steps()
        self.reference = self.output(steps)
        return {"kernel": "gemm.wgsl", "gemm_us": self.seconds(steps) * 1e6, "quantize_us": 0.0}

    def run_f32_tiles(self, tiles: tuple[int, int]) -> dict:
        try:
            steps = self.f32_steps(tiles)
        except ValueError as e:
            return {"kernel": f"f32 {tiles[0]}x{tiles[1]}", "skipped": str(e)}
        error = self.error(self.output(steps))
        return {
            "kernel": f"f32 {tiles[0]}x{tiles[1]}",
            "gemm_us": self.seconds(steps) * 1e6,
            "quantize_us": 0.0,
            "max_error": error,
            "wrong": not error <= 1e-4,
        }

    def run_q8(self, tiles: tuple[int, int]) -> dict:
        quantize, gemm = self.q8_steps(tiles)
        error = self.error(self.output(quantize + gemm))
        return {
            "kernel": f"{tiles[0]}x{tiles[1]}",
            "gemm_us": self.seconds(gemm) * 1e6,
            "quantize_us": self.seconds(quantize) * 1e6,
            "max_error": error,
            "wrong": not error <= WRONG,
        }


def warm_up(bench: Bench, seconds: float = 1.5) -> None:
    """Keep the GPU busy for `seconds` before the first timing: an H100 idle before ran the first
    configurations of a sweep at low clocks, 2-4x slower than the same kernels a moment later."""
    steps = tuple(bench.f32_steps())
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        bench.backend.replay(Plan("warm-up", steps * 10))
        bench.backend.read(bench.y, 0, 4)


def tops(shape: Shape, n_tokens: int, result: dict) -> float:
    seconds = (result["gemm_us"] + result["quantize_us"]) * 1e-6
    return shape.ops * n_tokens / seconds / 1e12


def show(shape: Shape, count: int, n_tokens: int, results: list[dict]) -> None:
    print(f"\n{shape}  x{count} layers  T={n_tokens}")
    for r in results:
        if "skipped" in r:
            print(f"  {r['kernel']:22} skipped: {r['skipped']}")
            continue
        quantize = f"+ {r['quantize_us']:7.1f} quantize" if r["quantize_us"] else " " * 18
        check = "" if "max_error" not in r else ("WRONG" if r["wrong"] else "ok") + f" ({r['max_error']:.2%})"
        rate = tops(shape, n_tokens, r)
        print(f"  {r['kernel']:22} {r['gemm_us']:9.1f} us {quantize}  {rate:7.3f} TOP/s  {check}")
    valid = [r for r in results if "gemm_us" in r and not r.get("wrong") and r["kernel"] != "gemm.wgsl"]
    if valid:
        best = min(valid, key=lambda r: r["gemm_us"] + r["quantize_us"])
        f32 = results[0]["gemm_us"]
        print(f"  best: {best['kernel']} ({f32 / (best['gemm_us'] + best['quantize_us']):.2f}x gemm.wgsl)")


def total_us(result: dict, shape: Shape) -> float:
    """GPU time of a shape in a prefill: the quantize is shared by the segments of a stacked input."""
    return result["gemm_us"] + (0.0 if shape.shares_input else result["quantize_us"])


def summarize(model: str, n_tokens: int, measured: list[tuple[Shape, int, list[dict]]]) -> dict:
    """A prefill's GEMM time: gemm.wgsl, the best q8 config per shape, the best single q8 config."""
    f32 = sum(count * rs[0]["gemm_us"] for _, count, rs in measured)
    best = 0.0
    per_config: dict[str, float] = {}
    for shape, count, rs in measured:
        valid = [r for r in rs[1:] if "gemm_us" in r and not r["wrong"]]
        best += count * min((total_us(r, shape) for r in valid), default=float("inf"))
        for r in rs[1:]:
            ok = "gemm_us" in r and not r["wrong"]
            per_config[r["kernel"]] = per_config.get(r["kernel"], 0.0) + (
                count * total_us(r, shape) if ok else 1e30
            )
    config, single = min(per_config.items(), key=lambda kv: kv[1]) if per_config else ("-", float("inf"))
    summary = {"model": model, "tokens": n_tokens, "f32_ms": f32 / 1e3, "q8_best_ms": best / 1e3}
    summary |= {"q8_single_config": config, "q8_single_ms": single / 1e3}
    print(f"\n{model} T={n_tokens}: the GEMMs of one prefill (every layer, GPU time)")
    print(f"  gemm.wgsl                {f32 / 1e3:9.2f} ms  ({n_tokens / f32 * 1e6:,.0f} tok/s)")
    print(f"  q8, best config per shape {best / 1e3:8.2f} ms  ({n_tokens / best * 1e6:,.0f} tok/s)")
    print(
        f"  q8, best single config   {single / 1e3:9.2f} ms  ({n_tokens / single * 1e6:,.0f} tok/s): {config}"
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="llama-3.1-8b,qwen2.5-7b", help="ladder recipes, comma-separated")
    parser.add_argument("--tokens", default="512,128", help="prompt lengths, comma-separated")
    parser.add_argument(
        "--configs", default=",".join(CANDIDATES), help="gemm_q8 tiles, comma-separated ('' none)"
    )
    parser.add_argument("--f32-configs", default=",".join(F32_CANDIDATES), help="gemm.wgsl tiles ('' none)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--extra-types", default="Q4_0,Q8_0", help="also gate/up of the first model in these")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 configs, 1 repeat: a smoke run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import numpy as np

    backend = NativeBackend()
    kernels = Kernels(backend)
    if args.quick:
        models, token_counts, configs, repeats = QUICK_SHAPES, [8, 40], QUICK_CANDIDATES, 1
    else:
        names = args.models.split(",")
        models = {name: SMALL_MODELS[name] if name in SMALL_MODELS else model_shapes(name) for name in names}
        for type_name in filter(None, args.extra_types.split(",")):
            if names[0] in SMALL_MODELS:
                break
            r = ladder.RECIPES[names[0]]
            gate_up = Shape("ffn_gate_up", type_name, r.d_model, r.d_ff, norm=True, gate_up=True)
            models[f"{names[0]} gate/up {type_name}"] = Counter({gate_up: r.n_layer})
        token_counts = [int(t) for t in args.tokens.split(",")]
        configs, repeats = args.configs.split(","), args.repeats
    tiles = [parse_config(c) for c in configs if c]
    f32_tiles = [parse_config(c) for c in args.f32_configs.split(",") if c] if not args.quick else [(8, 8)]
    print(
        f"adapter {backend.adapter_name}; features {sorted(backend.features)}; workgroup memory "
        f"{backend.limits.max_compute_workgroup_storage_size} bytes"
    )
    rng = np.random.default_rng(0)
    report = {"adapter": backend.adapter_name, "results": [], "summaries": []}
    warmed = False
    for model, shapes in models.items():
        per_tokens: dict[int, list] = {t: [] for t in token_counts}
        for shape, count in shapes.items():
            weight = random_weight(kernels, shape, rng)
            for n_tokens in token_counts:
                bench = Bench(kernels, shape, weight, n_tokens, rng, repeats)
                if not warmed:
                    warm_up(bench, 0.1 if args.quick else 1.5)
                    warmed = True
                results = [bench.run_f32()]
                results += [bench.run_f32_tiles(t) for t in f32_tiles]
                if shape.type_name in INT8_WEIGHT_TYPES:
                    results += [bench.run_q8(t) for t in tiles]
                bench.close()
                show(shape, count, n_tokens, results)
                per_tokens[n_tokens].append((shape, count, results))
                for r in results:
                    report["results"].append(
                        {"model": model, "shape": str(shape), "layers": count, "tokens": n_tokens}
                        | r
                        | ({"tops": tops(shape, n_tokens, r)} if "gemm_us" in r else {})
                    )
            for buf in (b for p in weight.parts for b in p.arrays.values()):
                backend.destroy_buffer(buf)
        kernels.uploads.release_upload_buffers()
        for n_tokens, measured in per_tokens.items():
            if measured:
                report["summaries"].append(summarize(model, n_tokens, measured))
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
