"""Chat templates: render the model's own `tokenizer.chat_template` (Jinja) in a sandbox.

The rendering follows the conventions of Hugging Face's apply_chat_template (the reference the
templates are written for): trim_blocks and lstrip_blocks on, the loop-controls extension,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text, and `bos_token` /
`eos_token` / `add_generation_prompt` in the context. Templates run in Jinja2's immutable
sandbox, so a hostile template cannot reach Python internals or mutate our data.

Jinja2 and MarkupSafe are pure Python (MarkupSafe's C speedups are optional), so the same code
runs in Pyodide from pure-Python wheels served by the page itself.
"""

import json
import operator
from datetime import datetime

from jinja2.exceptions import SecurityError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_OUTPUT_CHARS = 1 << 20  # a chat prompt is far shorter; a template producing more is broken or hostile
MAX_VALUE_ITEMS = 1 << 20  # largest string / list a template may build with * or **


class ChatTemplateError(ValueError):
    """The model's chat template failed to compile or render."""


def _raise_exception(message):
    raise ChatTemplateError(f"chat template raised: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox, plus bounds on the values `*` and `**` may build (a template from a
    downloaded file must not allocate without limit); range() is already capped by the sandbox."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator_name, left, right):
        if operator_name == "**":
            if isinstance(right, int | float) and abs(right) > 64:
                raise SecurityError("exponent too large")
            return operator.pow(left, right)
        sizes = [len(v) for v in (left, right) if isinstance(v, str | list | tuple)]
        counts = [v for v in (left, right) if isinstance(v, int) and not isinstance(v, bool)]
        if sizes and counts and sizes[0] * max(counts[0], 0) > MAX_VALUE_ITEMS:
            raise SecurityError("repetition too large")
        return operator.mul(left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except Exception as e:  # TemplateSyntaxError, RecursionError on absurd nesting, ...
            raise ChatTemplateError(f"chat template does not compile: {type(e).__name__}: {e}") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise ChatTemplateError(f"messages[{i}] must be a dict with 'role' and 'content'")
        context = dict(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            pieces, n_chars = [], 0
            for piece in self._template.generate(**context):  # streamed, so the output size is bounded
                n_chars += len(piece)
                if n_chars > MAX_OUTPUT_CHARS:
                    raise ChatTemplateError(f"chat template output exceeds {MAX_OUTPUT_CHARS} characters")
                pieces.append(piece)
            return "".join(pieces)
        except ChatTemplateError:
            raise
        except Exception as e:  # TemplateError, and what a template can raise by itself (TypeError, ...)
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None


def template_from_metadata(metadata: dict, token_text) -> ChatTemplate | None:
    """The model's chat template, or None (plain completion) when the GGUF has none.

    `token_text(id) -> str` gives the text of a token id, for bos_token / eos_token.
    """
    source = metadata.get("tokenizer.chat_template")
    if not isinstance(source, str) or not source.strip():
        return None
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    return ChatTemplate(
        source,
        bos_token=token_text(bos) if isinstance(bos, int) else "",
        eos_token=token_text(eos) if isinstance(eos, int) else "",
    )
