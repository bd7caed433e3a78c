import json
import subprocess
import sys

import pytest

from webgguf.cli import main

SMOLLM2 = "smollm2-135m-instruct"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module", autouse=True)
def models_present(model_path):
    model_path(SMOLLM2)


def test_inspect_json(capsys):
    code, out, _ = run(capsys, "inspect", SMOLLM2, "--json")
    assert code == 0
    info = json.loads(out)
    assert info["architecture"] == "llama"
    assert info["hyperparameters"]["block_count"] == 30
    assert info["tensors"]["count"] == 272
    assert info["tensors"]["by_type"]["Q4_1"]["count"] == 210
    assert info["tokenizer"]["n_vocab"] == 49152
    assert info["chat_template"].startswith("{% for message in messages %}")


def test_inspect_text(capsys):
    code, out, _ = run(capsys, "inspect", SMOLLM2)
    assert code == 0
    assert "architecture  llama" in out and "Q4_1" in out


def test_inspect_plan_says_which_kernel_runs_for_a_tensor_and_why(capsys):
    code, out, err = run(
        capsys, "inspect", SMOLLM2, "--plan", "--adapter", "cpu", "--filter", "blk.3.ffn_down"
    )
    assert code == 0, err
    assert "CPU-adapter shapes, no subgroups, f32" in out
    assert "decode step: 1 of 185 steps shown" in out
    assert "blk.3.ffn_down.weight.gemv[0:576]  [gemv, 9x1x1 workgroups]  gemv_rows[N_IN=1536," in out
    assert "CPU adapter: gemv_rows, no barriers" in out
    assert "blk.3.ffn_down.weight.gemm_rows[0:576]" in out  # the prefill chunk's GEMM
    assert "blk.4." not in out


def test_inspect_plan_json_on_a_gpu(capsys):
    code, out, _ = run(capsys, "inspect", SMOLLM2, "--plan", "--adapter", "gpu", "--json", "--chunk", "64")
    assert code == 0
    result = json.loads(out)
    assert result["fusions"] == ["attention_splits", "int8", "norms", "post_norm_adds", "quantize_outputs"]
    decode, prefill = result["plans"].values()
    assert len(decode) == 155  # 5 per layer + 5 (the int8 output head quantizes its input)
    down = [n for n in decode if n["tensor"] == "blk.3.ffn_down.weight"]
    assert [n["kernel"] for n in down] == [
        "gemv[N_IN=1536,RESIDUAL,ROWS=2,ROW_THREADS=128,SUBGROUPS,WEIGHTS=q4_1]"
    ]
    assert down[0]["workgroups"] == [288, 1, 1] and "576 rows" in down[0]["reason"]
    assert any(n["op"] == "gemm" and "f32 tiles of 32 tokens x 64 rows" in n["reason"] for n in prefill)
    # the last token's row, then its quantization, the (int8) output head and 2 sampler steps
    assert [n["op"] for n in prefill[-5:-3]] == ["copy", "quantize"]


def test_inspect_plan_on_this_machines_adapter(capsys):
    code, out, err = run(capsys, "inspect", SMOLLM2, "--plan", "--filter", "output")
    assert code == 0, err
    assert out.startswith("adapter  ") and "output.gemv[0:49152]" in out


def test_tokenize_json(capsys):
    code, out, _ = run(capsys, "tokenize", SMOLLM2, "<|im_start|>Hello world", "--special", "--json")
    assert code == 0
    ids = json.loads(out)["ids"]
    assert ids[0] == 1  # <|im_start|> parsed as one special token
    code, out, _ = run(capsys, "tokenize", SMOLLM2, "<|im_start|>Hello world", "--json")
    assert json.loads(out)["ids"][0] != 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "no-such-model"], "unknown model"),
        (["inspect", "/nonexistent/x.gguf"], "no such file"),
        (["generate", SMOLLM2], "--prompt"),
        (["generate", SMOLLM2, "--prompt", "x", "--max-tokens", "-1"], "max-tokens"),
        (["generate", SMOLLM2, "--prompt", "x", "--top-p", "0"], "top_p"),
        (["generate", SMOLLM2, "--prompt", "x", "--temperature", "nan"], "temperature"),
        (["score", SMOLLM2, "--ids", "1,x"], "comma-separated"),
        (["score", SMOLLM2, "--ids", "1,99999999"], "outside the vocabulary"),
        (["frobnicate"], "invalid choice"),
        (["inspect", SMOLLM2, "--plan", "--adapter", "cpu", "--filter", "blk.99.ffn_down"], "no dispatch"),
        (["inspect", SMOLLM2, "--plan", "--adapter", "cpu", "--chunk", "0"], "--chunk"),
        (["inspect", SMOLLM2, "--plan", "--adapter", "tpu"], "invalid choice"),
        (["inspect", SMOLLM2, "--adapter", "cpu"], "--adapter goes with --plan"),
    ],
)
def test_errors_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


def test_malformed_file_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    code, _, err = run(capsys, "inspect", str(bad))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_cli_entry_point_prints_no_traceback(tmp_path):
    bad = tmp_path / "random.gguf"
    bad.write_bytes(bytes(range(256)) * 4)
    result = subprocess.run(
        [sys.executable, "-m", "webgguf.cli", "tokenize", str(bad), "hi"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ")


@pytest.mark.whole_model
def test_generate_and_score_reference(capsys):
    code, out, _ = run(
        capsys,
        "generate",
        SMOLLM2,
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "6",
        "--backend",
        "reference",
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert 1 <= len(result["ids"]) <= 6
    assert "Paris" in result["text"]
    # Teacher forcing over prompt + generation: each greedy token is the top-1 of the row before it.
    code, out, _ = run(capsys, "tokenize", SMOLLM2, "The capital of France is", "--json")
    prompt = json.loads(out)["ids"]
    ids = prompt + result["ids"]
    code, out, _ = run(
        capsys,
        "score",
        SMOLLM2,
        "--ids",
        ",".join(map(str, ids)),
        "--top",
        "3",
        "--backend",
        "reference",
        "--json",
    )
    assert code == 0
    scores = json.loads(out)
    assert len(scores["top_ids"]) == len(ids) and len(scores["top_ids"][0]) == 3
    for pos in range(len(prompt) - 1, len(ids) - 1):
        assert scores["top_ids"][pos][0] == ids[pos + 1]


@pytest.mark.whole_model
def test_generate_gpu_equals_reference(capsys):
    argv = ["generate", SMOLLM2, "--prompt", "The capital of France is", "--max-tokens", "5", "--json"]
    code, out, _ = run(capsys, *argv, "--backend", "gpu")
    assert code == 0
    gpu = json.loads(out)
    code, out, _ = run(capsys, *argv, "--backend", "reference")
    assert gpu == json.loads(out)
    code, out, _ = run(
        capsys, "score", SMOLLM2, "--ids", "504,3575,282,4649,314", "--backend", "gpu", "--json"
    )
    assert code == 0 and json.loads(out)["top_ids"][-1][0] == gpu["ids"][0]
