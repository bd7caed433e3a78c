"""webgguf.model_urls: Hugging Face URLs as people paste them, and a split model's files from one URL."""

import pytest

from webgguf.model_urls import ModelUrlError, file_url, model_urls

HF = "https://huggingface.co"


@pytest.mark.parametrize(
    ("pasted", "expected"),
    [
        # the file page (what the site links and the address bar shows) -> the file's bytes
        (f"{HF}/org/repo/blob/main/model-Q4_K_M.gguf", f"{HF}/org/repo/resolve/main/model-Q4_K_M.gguf"),
        (f"{HF}/org/repo/resolve/main/model.gguf", f"{HF}/org/repo/resolve/main/model.gguf"),
        # raw/ serves a Git LFS pointer, not the file
        (f"{HF}/org/repo/raw/main/sub/dir/model.gguf", f"{HF}/org/repo/resolve/main/sub/dir/model.gguf"),
        (f"{HF}/org/repo/blob/refs%2Fpr%2F1/model.gguf", f"{HF}/org/repo/resolve/refs%2Fpr%2F1/model.gguf"),
        (f"{HF}/datasets/org/data/blob/main/m.gguf", f"{HF}/datasets/org/data/resolve/main/m.gguf"),
        (
            "https://hf.co/org/repo/blob/main/m.gguf?download=true#x",
            f"{HF}/org/repo/resolve/main/m.gguf?download=true",
        ),
        ("https://www.huggingface.co/org/repo/blob/main/m.gguf", f"{HF}/org/repo/resolve/main/m.gguf"),
        # other hosts are left as they are (a "blob" in their paths means nothing special)
        (
            "http://127.0.0.1:8000/org/repo/blob/main/m.gguf",
            "http://127.0.0.1:8000/org/repo/blob/main/m.gguf",
        ),
        ("https://example.com/m.gguf#frag", "https://example.com/m.gguf"),
    ],
)
def test_file_urls(pasted, expected):
    assert file_url(pasted) == expected


@pytest.mark.parametrize(
    ("pasted", "kind"),
    [
        (f"{HF}/org/repo", "repository"),
        (f"{HF}/org/repo/", "repository"),
        (f"{HF}/org/repo/tree/main/sub", "folder"),
    ],
)
def test_pages_that_are_not_files_are_refused(pasted, kind):
    with pytest.raises(
        ModelUrlError, match=f"a Hugging Face {kind} page, not a file: give the link of a .gguf"
    ):
        file_url(pasted)


def test_a_split_model_from_the_url_of_any_of_its_files():
    first = f"{HF}/org/repo/blob/main/Q4_K_M/big-Q4_K_M-00001-of-00003.gguf"
    urls = [f"{HF}/org/repo/resolve/main/Q4_K_M/big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert model_urls(first) == urls
    assert model_urls(urls[2]) == urls
    assert model_urls("http://h/m-00002-of-00002.gguf?x=1") == [
        "http://h/m-00001-of-00002.gguf?x=1",
        "http://h/m-00002-of-00002.gguf?x=1",
    ]
    assert model_urls("http://h/m-00001-of-00001.gguf") == ["http://h/m-00001-of-00001.gguf"]
    assert model_urls("http://h/m.gguf") == ["http://h/m.gguf"]
    assert model_urls("http://h/m-00004-of-00003.gguf") == [
        "http://h/m-00004-of-00003.gguf"
    ]  # not a shard name


def test_the_number_of_files_is_bounded():
    with pytest.raises(ModelUrlError, match="a split model of 99999 files; at most 256"):
        model_urls("http://h/m-00001-of-99999.gguf")
