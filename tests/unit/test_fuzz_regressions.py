"""Inputs the fuzz targets (fuzz/) failed on, minimized, each kept as a test of the behaviour it broke.

The raw fuzz input is recorded with each case (replay it with `python fuzz/fuzz_<target>.py FILE`);
the test states what that input means in terms of the API.
"""

import pytest

from webgguf.chat import ChatTemplate, ChatTemplateError, template_from_metadata
from webgguf.gguf import read_header
from webgguf.tokenizer import Tokenizer, TokenizerError

MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]


@pytest.fixture(scope="module")
def metadata(model_path):
    cache = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = read_header(model_path(name)).metadata
        return cache[name]

    return get


# ---- tokenizer -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_encode_lone_surrogate_is_a_tokenizer_error(name, parse_special, metadata):
    # fuzz_tokenizer input b"\x96\xed\xa0\x80": Gemma 3, text "\ud800" (UTF-8 with surrogatepass).
    # A lone surrogate has no UTF-8 form; encode let UnicodeEncodeError out of byte_encode (BPE) and
    # _encode_spm (SentencePiece) instead of a TokenizerError.
    text = b"\xed\xa0\x80".decode("utf-8", "surrogatepass")
    tokenizer = Tokenizer(metadata(name))
    with pytest.raises(TokenizerError):
        tokenizer.encode(text, parse_special=parse_special)


# ---- chat templates ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_template(metadata):
    smollm2 = metadata("smollm2-135m-instruct")
    return template_from_metadata(smollm2, lambda i: smollm2["tokenizer.ggml.tokens"][i])


@pytest.mark.parametrize(
    "content",
    [
        None,  # fuzz_chat input b"Q)Q)Q": SmolLM2's template, a user message whose content is None
        [{"type": "text", "text": "hi"}],  # content as a list of parts, as chat APIs also send it
    ],
)
def test_template_type_error_is_a_chat_template_error(content, smollm2_template):
    # The template concatenates '\n' + message['content']: Jinja2 raises a plain TypeError for a
    # non-string, which escaped ChatTemplate.render instead of becoming a ChatTemplateError.
    with pytest.raises(ChatTemplateError):
        smollm2_template.render([{"role": "user", "content": content}])


# Found by reading jinja2's sandbox while writing fuzz_chat: a template comes from the GGUF file, and
# errors other than jinja2.TemplateError escape compiling or rendering it.
@pytest.mark.parametrize(
    "source",
    [
        "{{ range(100001) | list }}",  # the sandbox's range limit raises OverflowError
        "{{ 1 / 0 }}",  # ZeroDivisionError
        "{% macro again(n) %}{{ again(n) }}{% endmacro %}{{ again(1) }}",  # RecursionError
        "{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}",  # RecursionError in Jinja2's parser
    ],
    ids=["range-limit", "zero-division", "recursive-macro", "deep-parentheses"],
)
def test_template_errors_of_any_kind_are_chat_template_errors(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
