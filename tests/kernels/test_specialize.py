"""The shader preprocessor and the kernel conventions (no GPU needed)."""

import re

import pytest

from webgguf.gpu import Pipeline
from webgguf.pipelines import SHADER_DIR, Kernel, specialize
from webgguf.weights import WEIGHT_TYPES

SOURCES = {
    "k.wgsl": """// k
#include "lib/a.wgsl"
#if FAST
fast
#if WEIGHTS == q8_0
fast q8
#else
fast other
#endif
#else
slow
#endif
#if WEIGHTS != q8_0
not q8
#endif
#include "lib/a.wgsl"
size ROWS""",
    "lib/a.wgsl": "library",
}


def test_conditions_includes_and_header():
    wgsl = specialize(SOURCES.get, "k", {"FAST": True, "WEIGHTS": "q8_0", "ROWS": 4}, ["enable f16;", ""])
    assert wgsl.splitlines() == [
        "enable f16;",
        "const ROWS: u32 = 4u;",
        "",
        "// k",
        "library",
        "fast",
        "fast q8",
        "size ROWS",
    ]
    wgsl = specialize(SOURCES.get, "k", {"FAST": False, "WEIGHTS": "q4_0", "ROWS": 1}, [])
    assert "slow" in wgsl and "not q8" in wgsl and "fast" not in wgsl


def test_a_define_the_shader_does_not_use_is_an_error():
    with pytest.raises(ValueError, match="not used by the shader: \\['FASTER'\\]"):
        specialize(SOURCES.get, "k", {"FASTER": True}, [])


@pytest.mark.parametrize(
    "source,error",
    [
        ("#if A B C\n#endif", "malformed"),
        ("#if A\n", "without #endif"),
        ("#endif", "without #if"),
        ("#else", "without #if"),
    ],
)
def test_malformed_directives(source, error):
    with pytest.raises(ValueError, match=error):
        specialize({"k.wgsl": source}.get, "k", {}, [])


def test_pack_params_layout():
    kernel = Kernel(Pipeline("k", None), {"params": 0}, (("n", "u32"), ("eps", "f32"), ("shift", "i32")))
    assert kernel.pack_params(n=3, eps=0.5, shift=-1) == bytes.fromhex("030000000000003fffffffff00000000")
    with pytest.raises(ValueError, match="missing or unknown"):
        kernel.pack_params(n=3, eps=0.5)


KERNELS = sorted(p.stem for p in SHADER_DIR.glob("*.wgsl"))


@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_documents_bindings_and_params(name):
    """One kernel per file: an entry point `main`, a binding table at the top, a Params struct whose
    fields all carry a comment (units)."""
    text = (SHADER_DIR / f"{name}.wgsl").read_text()
    assert text.count("@compute") == 1 and "fn main(" in text
    header = text.split("\n\n")[0]
    assert header.startswith(f"// {name}:") and "Bindings" in text.split("struct Params")[0]
    params = re.search(r"struct Params \{(.*?)\n\}", text, re.S).group(1)
    fields = [line for line in params.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert fields and all("//" in line for line in fields)


@pytest.mark.parametrize("weights", [t.lower() for t in WEIGHT_TYPES])
def test_weight_formats_define_load_w8(weights):
    source_of = lambda path: (SHADER_DIR / path).read_text()  # noqa: E731
    wgsl = specialize(source_of, "embed", {"WEIGHTS": weights, "ROW_THREADS": 64}, [])
    assert wgsl.count("fn load_w8(") == 1
