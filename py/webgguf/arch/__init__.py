"""Architecture families: one module per family turns GGUF metadata into a model config.

`config_from_metadata` dispatches on `general.architecture`. To add a family, write `arch/<family>.py` with a
`config_from_metadata(metadata, tensor_names)` function and list its GGUF architecture names in ARCHITECTURES.
"""

import importlib
from collections.abc import Iterable
from typing import Any

# GGUF `general.architecture` value -> module (under webgguf.arch) that reads its config.
# Mistral 7B and SmolLM2 GGUFs carry the architecture name "llama".
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "gemma3": "gemma3",
}


class ConfigError(ValueError):
    """The metadata does not describe a model this package can run (missing or invalid key)."""


class UnsupportedArchitecture(ConfigError):
    """`general.architecture` names a family with no module here."""


def config_from_metadata(metadata: dict[str, Any], tensor_names: Iterable[str]):
    """The model config of the family named by `general.architecture` (e.g. a LlamaConfig).

    tensor_names: the GGUF's tensor names; some config follows from which tensors exist
    (an absent `output.weight` means the output projection is tied to the token embedding).
    """
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedArchitecture(f"unsupported architecture {arch!r} (supported: {supported})")
    module = importlib.import_module(f"{__name__}.{ARCHITECTURES[arch]}")
    return module.config_from_metadata(metadata, tensor_names)


def module_for(config):
    """The architecture module of a config (it defines gpu_matrices, gpu_vectors and forward for the GPU)."""
    return importlib.import_module(f"{__name__}.{ARCHITECTURES[config.arch]}")


def has_gpu_forward(config) -> bool:
    return hasattr(module_for(config), "forward")


def gpu_module_for(config):
    """The architecture module, or a clear error when the GPU engine cannot run this family yet."""
    if not has_gpu_forward(config):
        raise UnsupportedArchitecture(
            f"the GPU engine has no forward pass for {config.arch!r} yet (the numpy reference has one)"
        )
    return module_for(config)


def read_key(metadata: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """metadata[key], checked to be a `kind` (an int is accepted for float).

    An absent key gives `default`, or a ConfigError when no default is given.
    """
    if key not in metadata:
        if default is None:
            raise ConfigError(f"missing metadata key {key!r}")
        return default
    value = metadata[key]
    accepted = (int, float) if kind is float else (kind,)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, accepted):
        raise ConfigError(f"metadata key {key!r} should be {kind.__name__}, got {type(value).__name__}")
    return kind(value)
