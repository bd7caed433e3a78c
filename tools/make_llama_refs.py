"""Make llama.cpp reference data for SmolLM2 (llama arch), checked by tests/models/test_reference_parity.py.

tests/refs/llama_smollm2.json: for each prompt, tokenize with llama.cpp's own tokenizer (special tokens as
the model's metadata says), generate 48 greedy tokens, then evaluate prompt + continuation in one batch with
logits_all and keep, per position, the top-8 token ids and their logits (position i's logits predict token
i + 1). Generation does not stop at end-of-turn tokens, so every prompt gives 48 positions to compare.
llama.cpp runs the Q4_1 model as shipped, so its matmuls quantize activations to 8 bits: the numpy
reference (f32 activations) is compared on next-token choice.

tests/refs/llama_smollm2_f32.json: the same sequences evaluated by llama.cpp on a copy of the model with
every tensor dequantized to F32, with an F32 KV cache. That is the numpy reference's own arithmetic (f32
weights equal to the dequantized Q4_1 ones, f32 activations), so logits are compared to a tight tolerance.

Run with the venv that has llama-cpp-python (built from source; see DESIGN.md):
    /tmp/llvenv/bin/python tools/make_llama_refs.py [--model PATH] [--out-dir DIR]
"""

import argparse
import json
import tempfile
from pathlib import Path

import gguf
import jinja2
import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT_DIR = ROOT / "tests/refs"
N_GENERATE = 48
TOP_K = 8
N_CTX = 1024
SEED = 1234

# Chat prompts are rendered with the model's own chat template; plain prompts are tokenized as they are.
PROMPTS = [
    {"name": "chat_question", "chat": [{"role": "user", "content": "Why is the sky blue? Explain briefly."}]},
    {
        "name": "chat_list",
        "chat": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "List five fruits that are red, one per line."},
        ],
    },
    {"name": "plain_prose", "text": "Once upon a time, in a small village by the sea, there lived"},
    {"name": "plain_code", "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'},
    {"name": "plain_list", "text": "Things to pack for a camping trip:\n1. A tent\n2."},
    {"name": "plain_question", "text": "Question: What is the boiling point of water at sea level?\nAnswer:"},
]


def load(model: Path, **options) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        model_path=str(model),
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_threads=2,
        seed=SEED,
        logits_all=True,
        verbose=False,
        **options,
    )


def render_chat(template: str, messages: list[dict], bos: str, eos: str) -> str:
    """The chat as text, rendered like Hugging Face's apply_chat_template (trim_blocks, lstrip_blocks)."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
    )


def greedy_continuation(llm: llama_cpp.Llama, prompt_ids: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(prompt_ids)
    generated = []
    for _ in range(n):
        next_id = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        generated.append(next_id)
        llm.eval([next_id])
    return generated


def top_logits(llm: llama_cpp.Llama, ids: list[int]) -> tuple[list[list[int]], list[list[float]]]:
    """Evaluate `ids` in one batch from an empty cache; the top-k ids and logits at every position."""
    llm.reset()
    llm.eval(ids)
    # A copy: llm.scores is a view of a buffer that the next eval overwrites.
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)  # [n, n_vocab]
    top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]  # [n, TOP_K]
    top_values = np.take_along_axis(logits, top, axis=1)  # [n, TOP_K]
    return top.tolist(), [[round(float(v), 4) for v in row] for row in top_values]


def prompt_text(llm: llama_cpp.Llama, prompt: dict) -> str:
    if "text" in prompt:
        return prompt["text"]
    bos = llm.detokenize([llm.token_bos()], special=True).decode()
    eos = llm.detokenize([llm.token_eos()], special=True).decode()
    return render_chat(llm.metadata["tokenizer.chat_template"], prompt["chat"], bos, eos)


def quantized_sequences(model: Path) -> tuple[list[dict], bool]:
    """Prompts, greedy continuations and top-k logits from the model as shipped; whether BOS was added."""
    llm = load(model)
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "true") == "true"
    sequences = []
    for prompt in PROMPTS:
        text = prompt_text(llm, prompt)
        # add_bos=True asks llama.cpp for the model's special prefix: BOS only if the metadata says so.
        prompt_ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        continuation = greedy_continuation(llm, prompt_ids, N_GENERATE)
        ids = prompt_ids + continuation
        top_ids, top_values = top_logits(llm, ids)
        sequences.append(
            {
                "name": prompt["name"],
                "text": text,
                "ids": ids,
                "n_prompt": len(prompt_ids),
                "top_ids": top_ids,
                "top_logits": top_values,
            }
        )
        print(f"{prompt['name']}: {len(prompt_ids)} prompt tokens -> {llm.detokenize(continuation)!r}")
    return sequences, add_bos


def write_dequantized_copy(src: Path, dst: Path) -> None:
    """`src` with every tensor dequantized to F32 (same metadata, same tensor names)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":  # written by GGUFWriter itself
            continue
        value_type = field.types[0]
        item_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, item_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # numpy shape, float32
        writer.add_tensor(tensor.name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def f32_sequences(model: Path, sequences: list[dict]) -> list[dict]:
    """Top-k logits of `sequences` from an F32 copy of the model with an F32 KV cache."""
    with tempfile.TemporaryDirectory() as tmp:
        f32_model = Path(tmp) / "model-f32.gguf"
        write_dequantized_copy(model, f32_model)
        f32_cache = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
        llm = load(f32_model, flash_attn=False, **f32_cache)
        f32 = []
        for seq in sequences:
            top_ids, top_values = top_logits(llm, seq["ids"])
            f32.append({"name": seq["name"], "ids": seq["ids"], "top_ids": top_ids, "top_logits": top_values})
        del llm
    return f32


def write_json(path: Path, model: Path, add_bos: bool, note: str, sequences: list[dict]) -> None:
    reference = {
        "model": model.name,
        "llama_cpp_python_version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "add_bos": add_bos,
        "top_k": TOP_K,
        "note": note,
        "sequences": sequences,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reference, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args()

    sequences, add_bos = quantized_sequences(args.model)
    position_note = "top_ids[i] / top_logits[i]: logits at position i (predicting token i + 1)"
    write_json(
        args.out_dir / "llama_smollm2.json",
        args.model,
        add_bos,
        f"{position_note}; prompt + {N_GENERATE} greedy tokens evaluated as one batch by llama.cpp",
        sequences,
    )
    write_json(
        args.out_dir / "llama_smollm2_f32.json",
        args.model,
        add_bos,
        f"{position_note}; llama.cpp on an F32 copy of the model (every tensor dequantized), F32 KV cache",
        f32_sequences(args.model, sequences),
    )


if __name__ == "__main__":
    main()
