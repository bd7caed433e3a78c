import jinja2
import pytest

from webgguf.chat import ChatTemplate, ChatTemplateError, template_from_metadata
from webgguf.gguf import read_header

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello. 👋"},
    {"role": "user", "content": "Name a prime > 10, and say why\nin one line."},
]


def jinja2_reference(source: str, messages, add_generation_prompt: bool, **tokens) -> str:
    """Plain Jinja2 with the settings chat templates are written for (trim/lstrip blocks)."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    return env.from_string(source).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **tokens
    )


@pytest.fixture(scope="module")
def smollm2_template(model_path):
    metadata = read_header(model_path("smollm2-135m-instruct")).metadata
    template = template_from_metadata(metadata, lambda i: metadata["tokenizer.ggml.tokens"][i])
    assert template is not None
    return template


@pytest.mark.parametrize("n_turns", [1, 2, 3, 4])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_equals_jinja2(smollm2_template, n_turns, add_generation_prompt):
    messages = CONVERSATION[:n_turns]
    ours = smollm2_template.render(messages, add_generation_prompt=add_generation_prompt)
    expected = jinja2_reference(
        smollm2_template.source,
        messages,
        add_generation_prompt,
        bos_token=smollm2_template.bos_token,
        eos_token=smollm2_template.eos_token,
    )
    assert ours.encode() == expected.encode()


def test_smollm2_known_rendering(smollm2_template):
    text = smollm2_template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_model_without_template_is_plain_completion(model_path):
    metadata = read_header(model_path("gemma-3-270m")).metadata
    assert template_from_metadata(metadata, lambda i: "") is None


def test_template_features_match_jinja2():
    source = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "  {{ m.role | upper }}: {{ m.content | trim }} {{ m | tojson }}\n"
        "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    ours = ChatTemplate(source, bos_token="<s>").render(CONVERSATION)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v: __import__("json").dumps(v, ensure_ascii=False)
    assert ours == env.from_string(source).render(
        messages=CONVERSATION, add_generation_prompt=True, bos_token="<s>"
    )


def test_raise_exception_is_a_clean_error():
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_python_internals():
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])


def test_bad_template_and_bad_messages():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="messages\\[0\\]"):
        ChatTemplate("{{ messages }}").render([{"content": "no role"}])


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'a' * 10**10 }}",  # unbounded repetition
        "{{ [1] * 100000000 }}",
        "{{ 2 ** 100000 }}",
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",  # output without bound
        "{{ range(100001) | list }}",
        "{{ 1 / 0 }}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",  # unbounded recursion
    ],
)
def test_hostile_templates_fail_cleanly(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_absurd_nesting_fails_to_compile_cleanly():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}")
