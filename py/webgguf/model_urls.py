"""The URLs of a model's files, from a URL as people paste it (the page's URL field, ?model=, the JS API).

- Hugging Face: the page of a file, https://huggingface.co/ORG/REPO/blob/REV/PATH (what the site
  links to and the address bar shows), is HTML; the file's bytes are at .../resolve/REV/PATH, which
  redirects to a CDN host that serves Range requests and CORS. A .../raw/REV/PATH URL serves the Git
  LFS pointer of a large file, not the file: it becomes /resolve/ too. The same holds for datasets
  (/datasets/ORG/REPO/...) and spaces. A repository or folder page is refused with what to give instead.
- A split model (gguf_split.py): the URL of any of its files gives the URLs of all, first to last.
"""

from urllib.parse import urlsplit, urlunsplit

from .gguf_split import MAX_SHARDS, parse_split_name

HF_HOSTS = {"huggingface.co", "www.huggingface.co", "hf.co"}
_REPO_KINDS = {"datasets", "spaces"}  # /datasets/ORG/REPO/...; models have no prefix
_FILE_VIEWS = {"blob", "raw"}  # page views of a file whose bytes are at /resolve/


class ModelUrlError(ValueError):
    """A URL that names no model file."""


def file_url(url: str) -> str:
    """The URL of the bytes of the file `url` points at (a Hugging Face page URL made a /resolve/ URL);
    other URLs come back as they are, without a fragment."""
    parts = urlsplit(url)._replace(fragment="")
    if parts.hostname not in HF_HOSTS:
        return urlunsplit(parts)
    segments = parts.path.split("/")[1:]  # "/ORG/REPO/blob/main/x.gguf" -> [ORG, REPO, blob, main, x.gguf]
    at = 3 if segments and segments[0] in _REPO_KINDS else 2  # where blob/resolve/tree/raw is
    view = segments[at] if len(segments) > at else ""
    if view in _FILE_VIEWS and len(segments) > at + 2:
        segments[at] = "resolve"
    elif view == "tree" or (view == "" and len(segments) >= at):
        raise ModelUrlError(
            f"{url} is a Hugging Face {'folder' if view == 'tree' else 'repository'} page, not a file: "
            "give the link of a .gguf file in it (…/resolve/main/NAME.gguf or …/blob/main/NAME.gguf)"
        )
    return urlunsplit(parts._replace(netloc="huggingface.co", path="/" + "/".join(segments)))


def model_urls(url: str) -> list[str]:
    """The URLs of every file of the model at `url`: [url] for a model of one file, or all shards of a
    split model whose file name (the last path segment) says which shard of how many it is."""
    url = file_url(url)
    parts = urlsplit(url)
    folder, _, name = parts.path.rpartition("/")
    split = parse_split_name(name)
    if split is None or split.count == 1:
        return [url]
    if split.count > MAX_SHARDS:
        raise ModelUrlError(f"{name}: a split model of {split.count} files; at most {MAX_SHARDS} are loaded")
    return [urlunsplit(parts._replace(path=f"{folder}/{split.shard(i)}")) for i in range(split.count)]
