"""How well llama.cpp agrees with itself on Gemma 3 270M: tests/refs/arch_gemma3_variants.json.

The sequences of tests/refs/arch_gemma3.json (llama.cpp on the Q4_K_M model as shipped: flash attention
off, F16 KV cache, one batch) evaluated again by llama.cpp in two other standard configurations of the same
model file, keeping the top-1 id at each compared position:

- flash_attn: flash attention on (what llama.cpp's own CLI picks by default on a CPU);
- f32_kv_cache: an F32 KV cache instead of F16.

Each of them rounds differently from the run as shipped, and where Gemma's top two logits are close its
top-1 flips. tests/models/test_arch_parity.py holds the engine to the same standard: it must agree with the
run as shipped at least as well as these configurations (and llama.cpp on F32 weights) do.

Run with the venv that has llama-cpp-python (built from source; see DESIGN.md):
    /tmp/llvenv/bin/python tools/make_llama_cpp_variants.py [--gemma3 PATH] [--out-dir DIR]
"""

import argparse
import json
from pathlib import Path

import llama_cpp
import numpy as np
from make_llama_refs import load

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GEMMA3 = ROOT / "models/cache/gemma-3-270m-q4_k_m.gguf"
DEFAULT_OUT_DIR = ROOT / "tests/refs"
VARIANTS = {
    "flash_attn": {"flash_attn": True},
    "f32_kv_cache": {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32},
}


def top1(llm: llama_cpp.Llama, seq: dict) -> list[int]:
    """llama.cpp's top-1 id at the positions that arch_gemma3.json compares (one batch, empty cache)."""
    ids = seq["ids"]
    llm.reset()
    llm.eval(ids)
    logits = np.array(
        llm.scores[seq["first_position"] : len(ids) - 1], dtype=np.float32
    )  # [positions, n_vocab]
    return np.argmax(logits, axis=1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma3", type=Path, default=DEFAULT_GEMMA3)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args()

    shipped = json.loads((args.out_dir / "arch_gemma3.json").read_text())["sequences"]
    variants = {}
    for name, options in VARIANTS.items():
        llm = load(args.gemma3, **options)
        variants[name] = {seq["name"]: top1(llm, seq) for seq in shipped}
        del llm
        agree = sum(
            int(np.sum(np.array(variants[name][seq["name"]]) == np.array(seq["top_ids"])[:, 0]))
            for seq in shipped
        )
        total = sum(len(seq["top_ids"]) for seq in shipped)
        print(f"{name}: {agree}/{total} top-1 equal to the run as shipped")
    reference = {
        "model": args.gemma3.name,
        "llama_cpp_python_version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "note": "top1[variant][sequence][i]: llama.cpp's top-1 id at position first_position + i of that "
        "sequence in arch_gemma3.json, with the variant's options on top of the run as shipped",
        "options": {
            name: {key: str(value) for key, value in options.items()} for name, options in VARIANTS.items()
        },
        "top1": variants,
    }
    path = args.out_dir / "arch_gemma3_variants.json"
    path.write_text(json.dumps(reference, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
