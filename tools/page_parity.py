"""The page's greedy tokens against the native engine's on the same GPU (the browser checked against native).

For each GGUF file: the native engine (wgpu) generates `--tokens` greedy tokens for each prompt, with the
page's engine settings (context, prefill chunk, readback batch: web/worker.py); then web/greedy.html does the
same in Chromium; the ids must be equal. Prints one line per prompt and a summary; exits 1 on a difference.
Runs where tools/page_bench.py runs (a GPU, Chromium with WebGPU on it: tools/device_browser.sh).

Usage: python tools/page_parity.py --chromium PATH [--swiftshader] [--tokens 32] MODEL.gguf...
"""

import argparse
import ast
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "py"), str(ROOT / "tools")]

from page_bench import GPU_FLAGS, SWIFTSHADER_FLAGS, PageServer  # noqa: E402

from webgguf.serve import WEB_DIST  # noqa: E402

# Prose, a list, code, a question, a story: 5 prompts of different kinds.
PROMPTS = [
    "The history of the printing press begins in",
    "Three things every beginner cook should know:\n1.",
    "def fibonacci(n):\n    ",
    "Q: Why is the sky blue?\nA:",
    "Once upon a time, in a small village by the sea,",
]


def worker_settings() -> dict:
    """N_CTX and BATCH of web/worker.py (it imports pyodide: read, not imported)."""
    tree = ast.parse((ROOT / "web" / "worker.py").read_text())
    names = {"N_CTX", "BATCH"}
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in names
    }


def native_greedy(model: Path, prompts: list[str], tokens: int) -> dict:
    """Greedy ids of the native engine, built as the page's worker builds its engine."""
    from webgguf.engine import GpuEngine, LoadedModel
    from webgguf.gpu.native import NativeBackend
    from webgguf.sampling import SamplingParams

    loaded = LoadedModel.open(model)
    backend = NativeBackend()
    page = worker_settings()
    # The prompt step: the engine's choice for the adapter (selection.prefill_chunk), as in the worker.
    engine = GpuEngine(loaded, backend, n_ctx=page["N_CTX"], batch=page["BATCH"])
    engine.upload_from_file()
    out = {"adapter": backend.adapter_name, "prompt_ids": [], "ids": []}
    for prompt in prompts:
        ids = loaded.prompt_ids(prompt)
        stream = asyncio.run(engine.generate(ids, SamplingParams(temperature=0), tokens))
        out["prompt_ids"].append(ids)
        out["ids"].append(stream.ids)
    engine.release()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="GGUF files (in one directory)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--swiftshader", action="store_true", help="WebGPU on SwiftShader, headless")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--limit", type=float, default=300, help="seconds for the page's result")
    parser.add_argument("--web", type=Path, default=WEB_DIST, help="the built page (tools/build_web.py)")
    args = parser.parse_args()

    flags = SWIFTSHADER_FLAGS if args.swiftshader else GPU_FLAGS
    server = PageServer(args.web, args.models[0].resolve().parent, args.chromium, flags)
    failed = False
    for model in args.models:
        native = native_greedy(model, PROMPTS, args.tokens)
        query = {
            "model": f"/models/{model.name}",
            "prompts": json.dumps(PROMPTS),
            "tokens": args.tokens,
            "report": 1,
        }
        page = server.open("greedy.html", query, args.limit).result
        if "error" in page:
            print(f"{model.name}: the page failed: {page['error']}")
            failed = True
            continue
        print(
            f"{model.name}: native on {native['adapter']}, the page on {page['adapter']} {page['features']}"
        )
        equal = 0
        for prompt, p_ids, n_ids, p_prompt, n_prompt in zip(
            PROMPTS, page["ids"], native["ids"], page["prompt_ids"], native["prompt_ids"], strict=True
        ):
            same = p_ids == n_ids and p_prompt == n_prompt
            equal += same
            where = "" if same else f"; first difference at token {first_difference(p_ids, n_ids)}"
            print(
                f"  {'equal' if same else 'DIFFERENT'}: {len(p_ids)} page / {len(n_ids)} native tokens"
                f"{where}: {prompt!r}"
            )
        print(f"  {equal}/{len(PROMPTS)} prompts equal")
        failed |= equal != len(PROMPTS)
    server.close()
    return 1 if failed else 0


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    sys.exit(main())
