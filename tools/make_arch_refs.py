"""Make llama.cpp reference data for architectures beyond llama, checked by tests/models/test_arch_parity.py.

tests/refs/arch_gemma3.json: Gemma 3 270M as shipped (Q4_K_M). For each prompt, tokenize with llama.cpp's own
tokenizer, generate 48 greedy tokens, evaluate prompt + continuation in one batch, and keep the top-8 ids and
logits at the positions that predict the continuation. One prompt is longer than the 512-token sliding window,
so that the local layers' window actually slides. llama.cpp's matmuls round activations to 8 bits there, so
the numpy reference (f32 activations) is compared on next-token choice.

tests/refs/arch_gemma3_f32.json: the same sequences on a copy of the model with every tensor dequantized to
F32 and an F32 KV cache: the reference's own arithmetic, compared on logits.

tests/refs/arch_synthetic.json: for each synthetic model of tools/make_synthetic_models.py (qwen2, qwen3,
llama with the Llama 3 pre-tokenizer), its recipe and sha256, and for a few prompts + 32 greedy tokens the
top-8 ids and logits at every position.

Run with the venv that has llama-cpp-python (built from source; see DESIGN.md):
    /tmp/llvenv/bin/python tools/make_arch_refs.py [--gemma3 PATH] [--tokenizer-gguf PATH] [--out-dir DIR]
"""

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
from make_llama_refs import greedy_continuation, load, write_dequantized_copy
from make_synthetic_models import DEFAULT_TOKENIZER_GGUF, RECIPES, write_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GEMMA3 = ROOT / "models/cache/gemma-3-270m-q4_k_m.gguf"
DEFAULT_OUT_DIR = ROOT / "tests/refs"
TOP_K = 8
GEMMA3_N_GENERATE = 48
SYNTHETIC_N_GENERATE = 32
GEMMA3_MIN_LONG_PROMPT = 600  # tokens: past the 512-token sliding window

# The GGUF carries no chat template, so chat prompts are written in Gemma's turn format.
GEMMA3_CHAT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"

LONG_DOCUMENT = """\
Harbor Point Lighthouse: notes from the keepers' logbooks, 1871-1958

The lighthouse at Harbor Point was first lit on the evening of 14 October 1871. The tower is built of local \
granite, forty-two feet tall, with walls five feet thick at the base and two feet thick under the lantern \
room. The original light was a fourth-order Fresnel lens lit by a whale-oil lamp with three concentric \
wicks; the keeper had to trim the wicks every four hours through the night, and the log shows that the \
first keeper, Thomas Avery, rarely slept more than five hours at a stretch during the winter months.

In 1878 the whale-oil lamp was replaced by a kerosene lamp, which burned brighter and needed less care. \
Kerosene was stored in a small brick oil house set sixty feet from the tower, after a fire at a lighthouse \
further up the coast showed how dangerous it was to keep fuel inside the tower itself. The oil house still \
stands, although its iron door was replaced in 1932.

The keepers' families lived in a two-story wooden house joined to the tower by a covered walkway. Avery's \
wife, Margaret, kept a vegetable garden behind the house and taught the children of the three fishing \
families on the point to read. When Thomas Avery died in the winter of 1889, Margaret was appointed keeper \
in his place and kept the light for another nineteen years. Her log entries are short and precise: the \
weather at dawn and dusk, the hours the lamp was lit, the ships that passed, and the supplies that arrived \
by boat each month.

The worst storm in the logbooks came on 26 November 1898. Margaret Avery wrote that the waves broke over \
the rocks at the foot of the tower for eleven hours, that spray reached the lantern room windows, and that \
she and her son kept the lamp burning all night by carrying kerosene up the stairs in small cans because \
the walkway had been torn away. Two schooners anchored in the lee of the point rode out the storm; both \
crews later signed a letter thanking the keeper, which is still kept in the town library.

A fog signal was added in 1904: a steam whistle at first, replaced by a compressed-air horn in 1921. The \
horn sounded two blasts every thirty seconds in fog, and the keepers complained in the log that it could \
be heard in the town for three miles inland. In 1931 the light was converted to electricity, and the \
Fresnel lens was fitted with a 500-watt bulb that turned on a clockwork motor, giving one white flash \
every ten seconds.

The last resident keeper, Walter Pryce, left in 1958, when the light was automated and the keepers' house \
was closed. The lens was removed in 1974 and is now on display in the maritime museum, while a modern \
plastic beacon on the gallery railing still flashes white every ten seconds. The town bought the keepers' \
house in 1986 and restored it as a museum, with the logbooks displayed in the room where Margaret Avery \
once wrote them.\
"""

GEMMA3_PROMPTS = [
    {"name": "chat_question", "text": GEMMA3_CHAT.format("Why is the sky blue? Explain briefly.")},
    {"name": "chat_list", "text": GEMMA3_CHAT.format("List five fruits that are red, one per line.")},
    {"name": "plain_prose", "text": "Once upon a time, in a small village by the sea, there lived"},
    {"name": "plain_code", "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'},
    {"name": "plain_question", "text": "Question: What is the boiling point of water at sea level?\nAnswer:"},
    {
        "name": "chat_long_document",
        "text": GEMMA3_CHAT.format(f"{LONG_DOCUMENT}\n\nWho kept the light in the storm of 1898, and how?"),
    },
]

SYNTHETIC_PROMPTS = [
    {"name": "plain_prose", "text": "Once upon a time, in a small village by the sea, there lived"},
    {"name": "plain_code", "text": "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"},
    {"name": "plain_numbers", "text": 'In 2024, 3.5% of 1,000 people said: "Don\'t!"'},
    {"name": "unicode", "text": "Café naïve — 東京 and Zürich, 😀 «quoted» text."},
]


def top_logits(llm: llama_cpp.Llama, ids: list[int], first: int) -> tuple[list[list[int]], list[list[float]]]:
    """Evaluate `ids` in one batch from an empty cache; the top-k ids and logits at positions first .. n - 2
    (those that predict a token of the sequence)."""
    llm.reset()
    llm.eval(ids)
    # A copy: llm.scores is a view of a buffer that the next eval overwrites.
    logits = np.array(llm.scores[first : len(ids) - 1], dtype=np.float32)  # [positions, n_vocab]
    top = np.argpartition(-logits, TOP_K, axis=1)[:, :TOP_K]  # [positions, TOP_K] unordered
    top_values = np.take_along_axis(logits, top, axis=1)  # [positions, TOP_K]
    order = np.argsort(-top_values, axis=1, kind="stable")
    top, top_values = np.take_along_axis(top, order, axis=1), np.take_along_axis(top_values, order, axis=1)
    return top.tolist(), [[round(float(v), 4) for v in row] for row in top_values]


def sequences(llm: llama_cpp.Llama, prompts: list[dict], n_generate: int, continuation_only: bool) -> list:
    """Each prompt (tokenized by llama.cpp, with the model's BOS if its metadata asks) + n_generate greedy
    tokens, and llama.cpp's top-k at the continuation's positions, or at every position."""
    result = []
    for prompt in prompts:
        prompt_ids = llm.tokenize(prompt["text"].encode(), add_bos=True, special=True)
        continuation = greedy_continuation(llm, prompt_ids, n_generate)
        ids = prompt_ids + continuation
        first = len(prompt_ids) - 1 if continuation_only else 0
        top_ids, top_values = top_logits(llm, ids, first)
        result.append(
            {
                "name": prompt["name"],
                "text": prompt["text"],
                "ids": ids,
                "n_prompt": len(prompt_ids),
                "first_position": first,
                "top_ids": top_ids,
                "top_logits": top_values,
            }
        )
        print(f"  {prompt['name']}: {len(prompt_ids)} prompt tokens -> {llm.detokenize(continuation)!r}")
    return result


def gemma3_refs(model: Path) -> tuple[list[dict], list[dict]]:
    """Sequences with top-k from the model as shipped, and the same from its F32 copy (F32 KV cache)."""
    llm = load(model)
    quantized = sequences(llm, GEMMA3_PROMPTS, GEMMA3_N_GENERATE, continuation_only=True)
    del llm
    longest = max(seq["n_prompt"] for seq in quantized)
    if longest < GEMMA3_MIN_LONG_PROMPT:
        raise SystemExit(f"the longest prompt has {longest} tokens; it must pass {GEMMA3_MIN_LONG_PROMPT}")
    with tempfile.TemporaryDirectory() as tmp:
        f32_model = Path(tmp) / "model-f32.gguf"
        write_dequantized_copy(model, f32_model)
        f32_cache = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
        llm = load(f32_model, flash_attn=False, **f32_cache)
        f32 = []
        for seq in quantized:
            top_ids, top_values = top_logits(llm, seq["ids"], seq["first_position"])
            f32.append({key: seq[key] for key in ("name", "ids", "n_prompt", "first_position")})
            f32[-1].update(top_ids=top_ids, top_logits=top_values)
        del llm
    return quantized, f32


def synthetic_refs(tokenizer_gguf: Path) -> list[dict]:
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in RECIPES.values():
            path = Path(tmp) / f"{recipe.name}.gguf"
            sha256 = write_model(recipe, path, tokenizer_gguf)
            print(f"{recipe.name} ({path.stat().st_size / 1e6:.1f} MB, sha256 {sha256})")
            llm = load(path)
            refs = sequences(llm, SYNTHETIC_PROMPTS, SYNTHETIC_N_GENERATE, continuation_only=False)
            models.append(
                {
                    "recipe": dataclasses.asdict(recipe),
                    "tokenizer_gguf": tokenizer_gguf.name,
                    "sha256": sha256,
                    "sequences": refs,
                }
            )
            del llm
    return models


def write_json(path: Path, content: dict) -> None:
    reference = {
        "llama_cpp_python_version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "top_k": TOP_K,
        "note": "top_ids[i] / top_logits[i]: logits at position first_position + i (predicting token "
        "first_position + i + 1), from the sequence evaluated as one batch by llama.cpp",
        **content,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reference, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma3", type=Path, default=DEFAULT_GEMMA3)
    parser.add_argument("--tokenizer-gguf", type=Path, default=DEFAULT_TOKENIZER_GGUF)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args()

    write_json(args.out_dir / "arch_synthetic.json", {"models": synthetic_refs(args.tokenizer_gguf)})
    print(args.gemma3.name)
    quantized, f32 = gemma3_refs(args.gemma3)
    write_json(args.out_dir / "arch_gemma3.json", {"model": args.gemma3.name, "sequences": quantized})
    f32_note = "llama.cpp on a copy of the model with every tensor dequantized to F32, F32 KV cache"
    f32_refs = {"model": args.gemma3.name, "f32": f32_note, "sequences": f32}
    write_json(args.out_dir / "arch_gemma3_f32.json", f32_refs)


if __name__ == "__main__":
    main()
