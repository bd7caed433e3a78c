"""Fuzz target: webgguf.chat's ChatTemplate.render with fuzzed conversations.

Each input becomes a conversation (roles, contents as text, as a list of content parts, or None) rendered
by one of three templates: SmolLM2's own (from its GGUF), one built like Gemma 3's (system turn folded
into the first user turn, strict role alternation through raise_exception, content parts), and one
using namespace, loop controls and tojson. The oracle is plain Jinja2 with the same settings: where it
renders, ours gives the same text (the sandbox changes nothing for a benign template); where it fails,
ours raises ChatTemplateError, and nothing else escapes.
"""

import json
import random

import atheris
import jinja2
from harness import fuzz
from jinja2.ext import loopcontrols

with atheris.instrument_imports(include=["webgguf"]):
    from webgguf import models
    from webgguf.chat import ChatTemplate, ChatTemplateError, template_from_metadata
    from webgguf.gguf import read_header

GEMMA_LIKE = """{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- if messages[0]['content'] is string -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
  {%- else -%}
    {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
  {%- endif -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_user_prefix = "" -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
  {%- endif -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
  {%- if message['content'] is string -%}
    {{ message['content'] | trim }}
  {%- elif message['content'] is iterable -%}
    {%- for item in message['content'] -%}
      {%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}
    {%- endfor -%}
  {%- else -%}
    {{ raise_exception("Invalid content type") }}
  {%- endif -%}
  {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}
"""

FEATURES = """{{ bos_token }}{% set ns = namespace(turns=0) %}
{% for m in messages %}
  {% if m.role == 'system' %}{% continue %}{% endif %}
  {% set ns.turns = ns.turns + 1 %}
  {{ m.role | upper }}: {{ m.content | tojson }} {{ m | tojson(indent=1) }}
  {% if ns.turns > 4 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}A:{{ eos_token }}{% endif %}
"""

ROLES = ("system", "user", "assistant", "tool")


def reference_environment() -> jinja2.Environment:
    """Plain Jinja2 with the settings and helpers chat templates are written for (no sandbox)."""

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env


def build_templates() -> list[tuple[ChatTemplate, jinja2.Template]]:
    metadata = read_header(models.ensure("smollm2-135m-instruct")).metadata
    smollm2 = template_from_metadata(metadata, lambda i: metadata["tokenizer.ggml.tokens"][i])
    ours = [smollm2, ChatTemplate(GEMMA_LIKE, "<bos>", "<eos>"), ChatTemplate(FEATURES, "<s>", "</s>")]
    env = reference_environment()
    return [(template, env.from_string(template.source)) for template in ours]


TEMPLATES = build_templates()


def content(fdp: atheris.FuzzedDataProvider):
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind == 5:
        return None  # as in an assistant message that only calls tools
    if kind == 4:
        return [
            {"type": "text", "text": fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 32))}
            if fdp.ConsumeBool()
            else {"type": "image"}
            for _ in range(fdp.ConsumeIntInRange(0, 2))
        ]
    return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 64))


def message(fdp: atheris.FuzzedDataProvider) -> dict:
    choice = fdp.ConsumeIntInRange(0, len(ROLES))
    role = ROLES[choice] if choice < len(ROLES) else fdp.ConsumeUnicode(8)
    return {"role": role, "content": content(fdp)}


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    template, reference = TEMPLATES[fdp.ConsumeIntInRange(0, len(TEMPLATES) - 1)]
    add_generation_prompt = fdp.ConsumeBool()
    messages = [message(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    try:
        expected = reference.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=template.bos_token,
            eos_token=template.eos_token,
        )
    except Exception:  # whatever makes plain Jinja2 fail must be a ChatTemplateError for us
        expected = None
    try:
        rendered = template.render(messages, add_generation_prompt=add_generation_prompt)
    except ChatTemplateError:
        rendered = None
    assert rendered == expected, f"rendered {rendered!r}, plain Jinja2 gives {expected!r} for {messages!r}"


def seeds() -> list[bytes]:
    rng = random.Random(0)
    return [rng.randbytes(n) for n in (8, 32, 64, 128, 256, 512) for _ in range(4)]


if __name__ == "__main__":
    fuzz(test_one_input, seeds())
