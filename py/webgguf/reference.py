"""The numpy reference forward pass (llama family): the numeric reference every GPU path is checked against.

Written for reading, top to bottom like llama2.c's run.c. Weights are dequantized once to float32 on load and
kept under their GGUF names; every matmul is float32 numpy. Shapes: n = tokens in the chunk, T = tokens in the
KV cache after the chunk, d = d_model, hd = head_dim.
"""

import os

import numpy as np

from webgguf.arch import ConfigError, config_from_metadata
from webgguf.arch.llama import LlamaConfig
from webgguf.quants import dequantize


class ReferenceModel:
    """A llama-family model in numpy with a KV cache.

    gguf: a path, or an open GGUF file (webgguf.gguf.GGUFFile: .header and .tensor_bytes(name)).
    """

    def __init__(self, gguf):
        if isinstance(gguf, str | os.PathLike):
            from webgguf.gguf import open_gguf

            with open_gguf(gguf) as gguf_file:
                self._load(gguf_file)
        else:
            self._load(gguf)
        self.reset()

    def _load(self, gguf_file) -> None:
        header = gguf_file.header
        self.config = config_from_metadata(header.metadata, header.tensors)
        if not isinstance(self.config, LlamaConfig):
            raise ConfigError(f"the reference forward pass runs the llama family, not {self.config.arch!r}")
        self.weights: dict[str, np.ndarray] = {
            name: dequantize(gguf_file.tensor_bytes(name), info.type.id, info.shape)
            for name, info in header.tensors.items()
        }
        if self.config.tied_output:
            self.weights["output.weight"] = self.weights["token_embd.weight"]

    def reset(self) -> None:
        """Empty the KV cache."""
        c = self.config
        self.key_cache = [np.zeros((0, c.n_head_kv, c.head_dim), np.float32) for _ in range(c.n_layer)]
        self.value_cache = [np.zeros((0, c.n_head_kv, c.head_dim), np.float32) for _ in range(c.n_layer)]

    @property
    def n_cached(self) -> int:
        """Tokens in the KV cache."""
        return self.key_cache[0].shape[0]

    def forward(self, ids: list[int], start_pos: int) -> np.ndarray:
        """Run tokens `ids` at positions start_pos.. and return their logits [len(ids), n_vocab].

        Attention is causal over the cache's first start_pos tokens plus the chunk; the chunk's keys and
        values then replace whatever the cache held from start_pos on (so start_pos < n_cached rewinds).
        """
        c = self.config
        w = self.weights
        if not 0 <= start_pos <= self.n_cached:
            raise ValueError(f"start_pos {start_pos} is outside the KV cache (0..{self.n_cached})")
        if not ids:
            raise ValueError("forward needs at least one token")
        n = len(ids)
        positions = np.arange(start_pos, start_pos + n)  # [n]
        rope_cos, rope_sin = self._rope_tables(positions)  # [n, rope_dims / 2] each

        x = w["token_embd.weight"][np.asarray(ids)]  # [n, d] the residual stream

        for layer in range(c.n_layer):
            p = f"blk.{layer}."

            # Attention block.
            h = rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)  # [n, d]
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, c.n_head, c.head_dim)  # [n, n_head, hd]
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, c.n_head_kv, c.head_dim)  # [n, n_head_kv, hd]
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, c.n_head_kv, c.head_dim)  # [n, n_head_kv, hd]
            q = apply_rope(q, rope_cos, rope_sin)
            k = apply_rope(k, rope_cos, rope_sin)

            keys = np.concatenate([self.key_cache[layer][:start_pos], k])  # [T, n_head_kv, hd]
            values = np.concatenate([self.value_cache[layer][:start_pos], v])  # [T, n_head_kv, hd]
            self.key_cache[layer] = keys
            self.value_cache[layer] = values

            attended = causal_attention(q, keys, values, start_pos)  # [n, n_head, hd]
            x = x + attended.reshape(n, c.n_head * c.head_dim) @ w[p + "attn_output.weight"].T  # [n, d]

            # Feed-forward block (SwiGLU).
            h = rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)  # [n, d]
            gate = h @ w[p + "ffn_gate.weight"].T  # [n, d_ff]
            up = h @ w[p + "ffn_up.weight"].T  # [n, d_ff]
            x = x + (silu(gate) * up) @ w[p + "ffn_down.weight"].T  # [n, d]

        x = rms_norm(x, w["output_norm.weight"], c.rms_eps)  # [n, d]
        return x @ w["output.weight"].T  # [n, n_vocab]

    def _rope_tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin of the rotation angles [n, rope_dims / 2].

        Pair i at position p turns by p * rope_scale * rope_base ** (-2i / rope_dims), divided by
        rope_freqs.weight[i] when the model has that tensor (Llama 3.1).
        """
        c = self.config
        pair = np.arange(c.rope_dims // 2)  # [rope_dims / 2]
        inv_freq = c.rope_base ** (-2.0 * pair / c.rope_dims)  # [rope_dims / 2] float64
        if "rope_freqs.weight" in self.weights:
            inv_freq = inv_freq / self.weights["rope_freqs.weight"]
        angles = np.outer(positions * c.rope_scale, inv_freq)  # [n, rope_dims / 2]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [n, d] scaled to unit root-mean-square per row, times weight [d]."""
    mean_square = np.mean(x * x, axis=-1, keepdims=True)  # [n, 1]
    return x / np.sqrt(mean_square + np.float32(eps)) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1) + np.exp(-x))


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the adjacent pairs (2i, 2i+1) of each head's first rope_dims dims (llama.cpp's "normal" rope;
    the GGUF converter permutes llama's q/k weights so that this layout applies).

    x [n, heads, hd], cos and sin [n, rope_dims / 2] -> [n, heads, hd]
    """
    n_pairs = cos.shape[1]
    pairs = x[..., : 2 * n_pairs].reshape(*x.shape[:-1], n_pairs, 2)  # [n, heads, rope_dims / 2, 2]
    even, odd = pairs[..., 0], pairs[..., 1]  # [n, heads, rope_dims / 2] each
    cos, sin = cos[:, None, :], sin[:, None, :]  # [n, 1, rope_dims / 2]
    rotated = np.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)  # [n, heads, pairs, 2]
    return np.concatenate([rotated.reshape(*x.shape[:-1], 2 * n_pairs), x[..., 2 * n_pairs :]], axis=-1)


def causal_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start_pos: int) -> np.ndarray:
    """Scaled dot-product attention of a chunk's queries over the cache + chunk, masked causally.

    q [n, n_head, hd] at positions start_pos.., keys and values [T, n_head_kv, hd] -> [n, n_head, hd].
    Query head h reads key/value head h // (n_head / n_head_kv) (grouped-query attention).
    """
    n, n_head, head_dim = q.shape
    n_total, n_head_kv, _ = keys.shape
    n_group = n_head // n_head_kv
    q = q.reshape(n, n_head_kv, n_group, head_dim).transpose(1, 2, 0, 3)  # [n_head_kv, n_group, n, hd]
    k = keys.transpose(1, 2, 0)[:, None]  # [n_head_kv, 1, hd, T]
    v = values.transpose(1, 0, 2)[:, None]  # [n_head_kv, 1, T, hd]

    scores = (q @ k) / np.float32(np.sqrt(head_dim))  # [n_head_kv, n_group, n, T]
    query_pos = start_pos + np.arange(n)[:, None]  # [n, 1]
    future = np.arange(n_total)[None, :] > query_pos  # [n, T] keys after the query
    scores = np.where(future, -np.inf, scores)
    probs = softmax(scores)  # [n_head_kv, n_group, n, T]
    out = probs @ v  # [n_head_kv, n_group, n, hd]
    return out.transpose(2, 0, 1, 3).reshape(n, n_head, head_dim)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)
