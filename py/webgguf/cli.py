"""webgguf command line: inspect | tokenize | generate | score | bench | serve | models.

MODEL is a manifest name or a path: a .gguf file, or any file of a split model (llama.cpp's
gguf-split: NAME-00001-of-00003.gguf ..., the others are found beside it).

Errors (bad file, unknown model, bad arguments) exit with status 2 and one line `error: ...` on
stderr, never a traceback.
"""

import argparse
import json
import sys

from . import models
from .chat import ChatTemplateError
from .gguf import GGUFError
from .sampling import SamplingParams

BACKENDS = ("reference", "gpu")


class UsageError(Exception):
    """Bad arguments or input: exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args) or 0
    except (UsageError, models.ModelError, GGUFError, ChatTemplateError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def build_parser() -> Parser:
    p = Parser(prog="webgguf", description="GGUF language models on WebGPU (natively on wgpu).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    s = sub.add_parser("inspect", help="architecture, hyperparameters, tensors, tokenizer, template")
    s.add_argument("model", help="manifest name or path to a .gguf file")
    s.add_argument("--json", action="store_true")
    s.add_argument(
        "--plan",
        action="store_true",
        help="instead: every dispatch of a decode step and a prefill chunk, its kernel and why",
    )
    s.add_argument(
        "--adapter",
        choices=("native", "cpu", "gpu"),
        default=None,
        help="with --plan: this machine's adapter (default), a CPU one (SwiftShader-like) or a GPU",
    )
    s.add_argument("--filter", metavar="TEXT", help="with --plan: only dispatches of tensors containing TEXT")
    s.add_argument("--f16", action="store_true", help="with --plan: the engine's f16 option")
    s.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="with --plan: prefill chunk tokens (default: the engine's for the adapter)",
    )
    s.set_defaults(run=cmd_inspect)

    s = sub.add_parser("tokenize", help="text -> token ids")
    s.add_argument("model")
    s.add_argument("text")
    s.add_argument("--special", action="store_true", help="parse special-token text such as <|im_start|>")
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_tokenize)

    s = sub.add_parser("generate", help="generate text from a prompt or a chat (streams to stdout)")
    s.add_argument("model")
    given = s.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt")
    given.add_argument(
        "--messages",
        metavar="FILE",
        help='a chat as JSON, [{"role": ..., "content": ...}, ...] ("-": stdin); the oldest turns are left '
        "out when it does not fit the context, as in the page",
    )
    s.add_argument("--chat", action="store_true", help="apply the model's chat template to one user message")
    s.add_argument("--ctx", type=int, default=None, help="context length (default: the training context)")
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-k", type=int, default=40)
    s.add_argument("--top-p", type=float, default=0.95)
    s.add_argument("--min-p", type=float, default=0.05)
    s.add_argument("--repeat-penalty", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_backend(s)
    s.add_argument("--json", action="store_true", help='print {"ids": [...], "text": ...} at the end')
    s.set_defaults(run=cmd_generate)

    s = sub.add_parser("score", help="teacher-forced top-k next-token logits for every position")
    s.add_argument("model")
    s.add_argument("--ids", required=True, help="comma-separated token ids")
    s.add_argument("--top", type=int, default=5)
    add_backend(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_score)

    s = sub.add_parser("bench", help="GPU prefill and decode speed, dispatches and CPU time per token")
    s.add_argument("model")
    s.add_argument("--prompt-tokens", type=int, default=512)
    s.add_argument("--gen-tokens", type=int, default=128)
    s.add_argument(
        "--int8",
        choices=["auto", "on", "off"],
        default="auto",
        help="8-bit activations with integer dot products for large linears (auto: on GPUs)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_bench)

    s = sub.add_parser("serve", help="serve the chat page and the cached models (COOP/COEP on)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--host", default="127.0.0.1")
    s.set_defaults(run=cmd_serve)

    s = sub.add_parser("models", help="list known models; --fetch NAME downloads one into the cache")
    s.add_argument("--fetch", metavar="NAME")
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_models)
    return p


def add_backend(s):
    s.add_argument("--backend", choices=BACKENDS, default=None, help="default: gpu when an adapter exists")


def open_model(name_or_path: str):
    """A manifest name or a path: a .gguf file, or any shard of a split model (the others beside it)."""
    from .engine import LoadedModel

    return LoadedModel.open(models.resolve(name_or_path))


def reference_model(model):
    from .gguf_split import open_model as open_files
    from .reference import ReferenceModel

    with open_files(model.path) as files:
        return ReferenceModel(files)


def choose_backend(requested: str | None):
    """("reference", None) or ("gpu", a native GPU backend). Default: the GPU when an adapter exists."""
    if requested == "reference":
        return "reference", None
    try:
        from .gpu.native import NativeBackend

        return "gpu", NativeBackend()
    except Exception as e:  # no wgpu, no Vulkan driver, no adapter
        if requested == "gpu":
            raise UsageError(f"no GPU backend: {e}") from None
        return "reference", None


def fall_back_for_architecture(model, backend: str, requested: str | None) -> str:
    """The default backend falls back to the reference for families the GPU engine cannot run yet."""
    from .arch import has_gpu_forward

    if backend == "gpu" and requested is None and not has_gpu_forward(model.config):
        print(
            f"note: no GPU forward pass for {model.config.arch!r} yet; using the numpy reference",
            file=sys.stderr,
        )
        return "reference"
    return backend


def gpu_engine(model, backend, n_ctx: int):
    from .engine import GpuEngine

    engine = GpuEngine(model, backend, n_ctx=n_ctx)
    engine.upload_from_file()
    return engine


def gpu_generate(
    model, backend, prompt_ids: list[int], params, max_tokens: int, n_ctx: int, stop=None, on_text=None
):
    """`generate --backend gpu`: the prompt (fitted to n_ctx) through the GPU engine, whose KV cache holds
    what this run needs, not the whole context; the engine's GPU memory is freed after."""
    import asyncio

    engine = gpu_engine(model, backend, n_ctx=min(n_ctx, len(prompt_ids) + max_tokens + 1))
    try:
        return asyncio.run(engine.generate(prompt_ids, params, max_tokens, stop or [], on_text))
    finally:
        engine.release()


def cmd_inspect(args):
    from .describe import describe, format_text

    if args.plan:
        return cmd_inspect_plan(args)
    given = [
        flag
        for flag, value in (
            ("--adapter", args.adapter),
            ("--filter", args.filter),
            ("--f16", args.f16),
            ("--chunk", args.chunk),
        )
        if value not in (None, False)
    ]
    if given:
        raise UsageError(f"{given[0]} goes with --plan")
    info = describe(open_model(args.model))
    print(json.dumps(info, indent=2) if args.json else format_text(info))


def cmd_inspect_plan(args):
    """Which kernel runs for each dispatch on an adapter, and why (explain.py)."""
    from . import explain
    from .gguf import read_header

    chunk = args.chunk
    if chunk is not None and chunk < 1:
        raise UsageError("--chunk must be >= 1")
    header = read_header(models.resolve(args.model))
    backend = explain.planning_backend(args.adapter or "native")
    result = explain.explain(header, backend, f16=args.f16, chunk=chunk)
    if args.filter and not any(explain.matching(notes, args.filter) for notes in result["plans"].values()):
        raise UsageError(
            f"no dispatch of the plans is about {args.filter!r} (tensors are named as in the GGUF, with "
            "q|k|v stacked as blk.N.attn_qkv and gate|up as blk.N.ffn_gate_up)"
        )
    if args.json:
        print(json.dumps(explain.as_json(result, args.filter), indent=2))
    else:
        print(explain.format_text(result, args.filter))


def cmd_tokenize(args):
    model = open_model(args.model)
    ids = model.tokenizer.encode(args.text, add_special=True, parse_special=args.special)
    print(json.dumps({"ids": ids}) if args.json else " ".join(map(str, ids)))


def cmd_generate(args):
    if args.max_tokens < 0:
        raise UsageError("--max-tokens must be >= 0")
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
    )
    model = open_model(args.model)
    n_ctx = model.config.n_ctx_train if args.ctx is None else args.ctx
    if not 16 <= n_ctx <= model.config.n_ctx_train:
        raise UsageError(f"--ctx must be in 16..{model.config.n_ctx_train} (the model's training context)")
    prompt_ids = fitted_prompt(model, args, n_ctx)
    backend, device = choose_backend(args.backend)
    backend = fall_back_for_architecture(model, backend, args.backend)
    on_text = None if args.json else write_now
    if backend == "reference":
        from .engine import reference_generate

        reference = reference_model(model)
        stream = reference_generate(
            model, reference, prompt_ids, params, args.max_tokens, args.stop, on_text, n_ctx=n_ctx
        )
    else:
        stream = gpu_generate(model, device, prompt_ids, params, args.max_tokens, n_ctx, args.stop, on_text)
    if args.json:
        result = {"ids": stream.ids, "text": stream.text, "finish_reason": stream.finish_reason}
        print(json.dumps(result))
    else:
        sys.stdout.write("\n")


def fitted_prompt(model, args, n_ctx: int) -> list[int]:
    """The prompt's ids by the page's policy (chat_fit): a chat leaves room for the reply and drops its
    oldest turns to fit; a raw prompt is never truncated."""
    from .chat_fit import fit_chat, fit_prompt

    if args.messages is not None:
        messages = read_messages(args.messages)
    elif args.chat:
        messages = [{"role": "user", "content": args.prompt}]
    else:
        return fit_prompt(model, args.prompt, n_ctx).ids
    if model.template is None:
        if args.messages is not None:
            raise UsageError(f"{model.path.name} has no chat template: give --prompt")
        print("note: the model has no chat template; using plain completion", file=sys.stderr)
        return fit_prompt(model, args.prompt, n_ctx).ids
    ids, dropped = fit_chat(model, messages, n_ctx, args.max_tokens)
    if dropped:
        print(
            f"note: the {dropped} oldest message{'s were' if dropped > 1 else ' was'} left out to fit "
            f"the context of {n_ctx} tokens",
            file=sys.stderr,
        )
    return ids


def read_messages(where: str):
    try:
        text = sys.stdin.read() if where == "-" else open(where, encoding="utf-8").read()
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--messages {where}: not JSON ({e})") from None


def write_now(text: str):
    sys.stdout.write(text)
    sys.stdout.flush()


def parse_ids(text: str, n_vocab: int) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise UsageError("--ids must be comma-separated integers") from None
    if not ids:
        raise UsageError("--ids is empty")
    bad = [i for i in ids if not 0 <= i < n_vocab]
    if bad:
        raise UsageError(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
    return ids


def cmd_score(args):
    import numpy as np

    if args.top < 1:
        raise UsageError("--top must be >= 1")
    model = open_model(args.model)
    backend, device = choose_backend(args.backend)
    backend = fall_back_for_architecture(model, backend, args.backend)
    ids = parse_ids(args.ids, model.tokenizer.n_vocab)
    if len(ids) > model.config.n_ctx_train:
        raise UsageError(f"{len(ids)} ids exceed the context of {model.config.n_ctx_train}")
    if backend == "reference":
        logits = reference_model(model).forward(ids, 0)  # [T, n_vocab]
    else:
        engine = gpu_engine(model, device, n_ctx=len(ids))
        n_vocab = model.config.n_vocab
        rows = [
            np.frombuffer(read.wait(), np.float32).reshape(-1, n_vocab)
            for _, read in engine.score_chunks(ids)
        ]
        logits = np.concatenate(rows)  # [T, n_vocab]
    k = min(args.top, logits.shape[1])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # [T, k]
    result = {
        "top_ids": top.tolist(),
        "top_logits": np.take_along_axis(logits, top, axis=1).astype(np.float64).round(5).tolist(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for pos, (row_ids, row_logits) in enumerate(
            zip(result["top_ids"], result["top_logits"], strict=True)
        ):
            pairs = " ".join(f"{i}:{v:.3f}" for i, v in zip(row_ids, row_logits, strict=True))
            print(f"{pos}\t{pairs}")


def cmd_bench(args):
    from .bench import format_bench, run_bench

    if args.prompt_tokens < 1 or args.gen_tokens < 1:
        raise UsageError("--prompt-tokens and --gen-tokens must be >= 1")
    _, device = choose_backend("gpu")
    model = open_model(args.model)
    if args.prompt_tokens + args.gen_tokens + 2 > model.config.n_ctx_train:
        raise UsageError(
            f"prompt + generated tokens exceed the model's context of {model.config.n_ctx_train}"
        )
    int8 = {"auto": None, "on": True, "off": False}[args.int8]
    result = run_bench(model, device, args.prompt_tokens, args.gen_tokens, int8=int8)
    print(json.dumps(result, indent=2) if args.json else format_bench(result))


def cmd_serve(args):
    from .serve import serve

    if not 0 <= args.port < 65536:
        raise UsageError("--port must be in 0..65535")
    serve(args.port, args.host)


def cmd_models(args):
    if args.fetch:
        print(models.ensure(args.fetch))
        return
    rows = [
        {"name": n, "cached": models.is_cached(n), "path": str(models.cached_path(n))}
        for n in models.model_names()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['name']:28} {'cached' if r['cached'] else 'not cached':11} {r['path']}")


if __name__ == "__main__":
    sys.exit(main())
