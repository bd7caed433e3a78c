"""What `webgguf inspect` reports: architecture, hyperparameters, tensors, tokenizer, chat template."""

from collections import Counter


def describe(model) -> dict:
    md = model.header.metadata
    architecture = md.get("general.architecture", "?")
    hyper = {k[len(architecture) + 1 :]: v for k, v in md.items() if k.startswith(architecture + ".")}
    counts, nbytes, elems = Counter(), Counter(), Counter()
    for t in model.header.tensors.values():
        counts[t.type.name] += 1
        nbytes[t.type.name] += t.nbytes
        elems[t.type.name] += t.n_elements
    tok = model.tokenizer
    return {
        "file": str(model.path),
        "gguf_version": model.header.version,
        "name": md.get("general.name"),
        "architecture": architecture,
        "hyperparameters": hyper,
        "parameters": sum(elems.values()),
        "tensors": {
            "count": len(model.header.tensors),
            "bytes": sum(nbytes.values()),
            "by_type": {name: {"count": counts[name], "bytes": nbytes[name]} for name in sorted(counts)},
        },
        "tokenizer": {
            "model": md.get("tokenizer.ggml.model"),
            "pre": md.get("tokenizer.ggml.pre"),
            "n_vocab": tok.n_vocab,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "eog_ids": sorted(tok.eog_ids),
            "add_bos": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        },
        "chat_template": model.template.source if model.template else None,
    }


def format_text(info: dict) -> str:
    lines = [
        f"file          {info['file']}",
        f"name          {info['name']}",
        f"architecture  {info['architecture']}  (GGUF v{info['gguf_version']})",
        f"parameters    {info['parameters'] / 1e6:.1f} M",
        "hyperparameters:",
    ]
    lines += [f"  {k:34} {v}" for k, v in info["hyperparameters"].items()]
    t = info["tensors"]
    lines.append(f"tensors       {t['count']} tensors, {t['bytes'] / 2**20:.1f} MiB")
    lines += [
        f"  {name:8} {v['count']:5} tensors {v['bytes'] / 2**20:9.1f} MiB" for name, v in t["by_type"].items()
    ]
    k = info["tokenizer"]
    lines.append(
        f"tokenizer     {k['model']} (pre: {k['pre']}), {k['n_vocab']} tokens, bos {k['bos_id']}, "
        f"eos {k['eos_id']}, end-of-generation {k['eog_ids']}, add_bos {k['add_bos']}"
    )
    template = info["chat_template"]
    lines.append("chat template " + (f"{len(template)} chars" if template else "none (plain completion)"))
    return "\n".join(lines)
