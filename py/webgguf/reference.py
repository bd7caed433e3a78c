"""The numpy reference forward passes: the numeric reference every GPU path is checked against.

One forward function per architecture family (llama, qwen, gemma3), each written for reading, top to bottom
like llama2.c's run.c, from the shared steps at the end of this file (RMSNorm, RoPE in both layouts,
attention). Weights are dequantized once to float32 on load and kept under their GGUF names; every matmul is
float32 numpy. Shapes: n = tokens in the chunk, m = tokens whose logits are returned (the chunk's last m),
T = tokens in the KV cache after the chunk, d = d_model, hd = head_dim.
"""

import os

import numpy as np

from webgguf.arch import config_from_metadata
from webgguf.arch.gemma3 import Gemma3Config
from webgguf.arch.llama import LlamaConfig
from webgguf.arch.qwen import QwenConfig
from webgguf.quants import dequantize


class ReferenceModel:
    """A model in numpy with a KV cache (any family in FORWARD_PASSES).

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

    def forward(self, ids: list[int], start_pos: int, n_logits: int | None = None) -> np.ndarray:
        """Run tokens `ids` at positions start_pos.. and return the logits of the last n_logits of them
        (all when None): [n_logits, n_vocab]. Row i predicts the token after ids[len(ids) - n_logits + i].

        Attention is causal over the cache's first start_pos tokens plus the chunk; the chunk's keys and
        values then replace whatever the cache held from start_pos on (so start_pos < n_cached rewinds).
        """
        if not 0 <= start_pos <= self.n_cached:
            raise ValueError(f"start_pos {start_pos} is outside the KV cache (0..{self.n_cached})")
        if not ids:
            raise ValueError("forward needs at least one token")
        n_logits = len(ids) if n_logits is None else n_logits
        if not 1 <= n_logits <= len(ids):
            raise ValueError(f"n_logits {n_logits} should be in 1..{len(ids)}")
        return FORWARD_PASSES[type(self.config)](self, ids, start_pos, n_logits)

    def attend(self, layer: int, q, k, v, start_pos: int, scale: float, window: int = 0) -> np.ndarray:
        """Store the chunk's k, v [n, n_head_kv, hd] in the layer's cache at start_pos.., then attend with
        q [n, n_head, hd] over the cache (see causal_attention) -> [n, n_head, hd]."""
        keys = np.concatenate([self.key_cache[layer][:start_pos], k])  # [T, n_head_kv, hd]
        values = np.concatenate([self.value_cache[layer][:start_pos], v])  # [T, n_head_kv, hd]
        self.key_cache[layer] = keys
        self.value_cache[layer] = values
        return causal_attention(q, keys, values, start_pos, scale, window)


# --- the forward passes ------------------------------------------------------------------------------------


def llama_forward(model: ReferenceModel, ids: list[int], start_pos: int, n_logits: int) -> np.ndarray:
    """Llama (and Mistral, SmolLM2): pre-norm attention with adjacent-pair RoPE, SwiGLU FFN."""
    c, w = model.config, model.weights
    n = len(ids)
    positions = np.arange(start_pos, start_pos + n)  # [n]
    # rope_freqs.weight: Llama 3.1's long-context frequency factors, when the model has them.
    freq_factors = w.get("rope_freqs.weight")
    rope_cos, rope_sin = rope_tables(positions, c.rope_base, c.rope_dims, c.rope_scale, freq_factors)

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
        attended = model.attend(layer, q, k, v, start_pos, 1 / np.sqrt(c.head_dim))  # [n, n_head, hd]
        x = x + attended.reshape(n, c.n_head * c.head_dim) @ w[p + "attn_output.weight"].T  # [n, d]

        # Feed-forward block (SwiGLU).
        h = rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)  # [n, d]
        gate = h @ w[p + "ffn_gate.weight"].T  # [n, d_ff]
        up = h @ w[p + "ffn_up.weight"].T  # [n, d_ff]
        x = x + (silu(gate) * up) @ w[p + "ffn_down.weight"].T  # [n, d]

    x = rms_norm(x[n - n_logits :], w["output_norm.weight"], c.rms_eps)  # [m, d]
    return x @ w["output.weight"].T  # [m, n_vocab]


def qwen_forward(model: ReferenceModel, ids: list[int], start_pos: int, n_logits: int) -> np.ndarray:
    """Qwen 2 / Qwen 3: llama's blocks with q/k/v biases (qwen2) or per-head q/k RMSNorm (qwen3), and RoPE
    in the NeoX layout."""
    c, w = model.config, model.weights
    n = len(ids)
    positions = np.arange(start_pos, start_pos + n)  # [n]
    rope_cos, rope_sin = rope_tables(positions, c.rope_base, c.rope_dims, c.rope_scale)

    x = w["token_embd.weight"][np.asarray(ids)]  # [n, d] the residual stream

    for layer in range(c.n_layer):
        p = f"blk.{layer}."

        # Attention block.
        h = rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)  # [n, d]
        q = h @ w[p + "attn_q.weight"].T  # [n, n_head * hd]
        k = h @ w[p + "attn_k.weight"].T  # [n, n_head_kv * hd]
        v = h @ w[p + "attn_v.weight"].T  # [n, n_head_kv * hd]
        if c.qkv_bias:
            q = q + w[p + "attn_q.bias"]
            k = k + w[p + "attn_k.bias"]
            v = v + w[p + "attn_v.bias"]
        q = q.reshape(n, c.n_head, c.head_dim)  # [n, n_head, hd]
        k = k.reshape(n, c.n_head_kv, c.head_dim)  # [n, n_head_kv, hd]
        v = v.reshape(n, c.n_head_kv, c.head_dim)  # [n, n_head_kv, hd]
        if c.qk_norm:
            q = rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps)  # each head over its hd dims
            k = rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps)
        q = apply_rope_neox(q, rope_cos, rope_sin)
        k = apply_rope_neox(k, rope_cos, rope_sin)
        attended = model.attend(layer, q, k, v, start_pos, 1 / np.sqrt(c.head_dim))  # [n, n_head, hd]
        x = x + attended.reshape(n, c.n_head * c.head_dim) @ w[p + "attn_output.weight"].T  # [n, d]

        # Feed-forward block (SwiGLU).
        h = rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)  # [n, d]
        gate = h @ w[p + "ffn_gate.weight"].T  # [n, d_ff]
        up = h @ w[p + "ffn_up.weight"].T  # [n, d_ff]
        x = x + (silu(gate) * up) @ w[p + "ffn_down.weight"].T  # [n, d]

    x = rms_norm(x[n - n_logits :], w["output_norm.weight"], c.rms_eps)  # [m, d]
    return x @ w["output.weight"].T  # [m, n_vocab]


def gemma3_forward(model: ReferenceModel, ids: list[int], start_pos: int, n_logits: int) -> np.ndarray:
    """Gemma 3: scaled embeddings, q/k RMSNorm, NeoX RoPE, sandwich norms, GELU-gated FFN, and local
    (sliding-window) layers with their own RoPE base between the global ones. The GGUF's norm weights
    already hold Gemma's (1 + weight), so they multiply as they are."""
    c, w = model.config, model.weights
    n = len(ids)
    positions = np.arange(start_pos, start_pos + n)  # [n]
    # cos and sin [n, rope_dims / 2] for the global layers, and for the local ones (never scaled).
    global_rope = rope_tables(positions, c.rope_base, c.rope_dims, c.rope_scale)
    local_rope = rope_tables(positions, c.rope_base_local, c.rope_dims, 1.0)

    x = w["token_embd.weight"][np.asarray(ids)] * np.float32(c.embedding_scale)  # [n, d] the residual stream

    for layer in range(c.n_layer):
        p = f"blk.{layer}."
        local = c.local_layers[layer]
        rope_cos, rope_sin = local_rope if local else global_rope

        # Attention block; its output is normalized before the residual add.
        h = rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)  # [n, d]
        q = (h @ w[p + "attn_q.weight"].T).reshape(n, c.n_head, c.head_dim)  # [n, n_head, hd]
        k = (h @ w[p + "attn_k.weight"].T).reshape(n, c.n_head_kv, c.head_dim)  # [n, n_head_kv, hd]
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, c.n_head_kv, c.head_dim)  # [n, n_head_kv, hd]
        q = rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps)  # each head over its hd dims
        k = rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps)
        q = apply_rope_neox(q, rope_cos, rope_sin)
        k = apply_rope_neox(k, rope_cos, rope_sin)
        window = c.sliding_window if local else 0
        attended = model.attend(layer, q, k, v, start_pos, c.query_scale, window)  # [n, n_head, hd]
        h = attended.reshape(n, c.n_head * c.head_dim) @ w[p + "attn_output.weight"].T  # [n, d]
        x = x + rms_norm(h, w[p + "post_attention_norm.weight"], c.rms_eps)  # [n, d]

        # Feed-forward block (GELU-gated), also normalized before the residual add.
        h = rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)  # [n, d]
        gate = h @ w[p + "ffn_gate.weight"].T  # [n, d_ff]
        up = h @ w[p + "ffn_up.weight"].T  # [n, d_ff]
        h = (gelu_tanh(gate) * up) @ w[p + "ffn_down.weight"].T  # [n, d]
        x = x + rms_norm(h, w[p + "post_ffw_norm.weight"], c.rms_eps)  # [n, d]

    x = rms_norm(x[n - n_logits :], w["output_norm.weight"], c.rms_eps)  # [m, d]
    logits = x @ w["output.weight"].T  # [m, n_vocab]
    if c.final_logit_softcap:
        cap = np.float32(c.final_logit_softcap)
        logits = cap * np.tanh(logits / cap)
    return logits


# Which forward pass runs a config (one per architecture module).
FORWARD_PASSES = {LlamaConfig: llama_forward, QwenConfig: qwen_forward, Gemma3Config: gemma3_forward}


# --- the steps ---------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [..., k] scaled to unit root-mean-square over its last axis, times weight [k]."""
    mean_square = np.mean(x * x, axis=-1, keepdims=True)  # [..., 1]
    return x / np.sqrt(mean_square + np.float32(eps)) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1) + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu; Gemma's gelu_pytorch_tanh)."""
    inner = np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))


def rope_tables(
    positions: np.ndarray, base: float, rope_dims: int, scale: float, freq_factors: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the rotation angles [n, rope_dims / 2].

    Pair i at position p turns by p * scale * base ** (-2i / rope_dims), divided by freq_factors[i] when
    given (Llama 3.1's rope_freqs.weight).
    """
    pair = np.arange(rope_dims // 2)  # [rope_dims / 2]
    inv_freq = base ** (-2.0 * pair / rope_dims)  # [rope_dims / 2] float64
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors
    angles = np.outer(positions * scale, inv_freq)  # [n, rope_dims / 2]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


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


def apply_rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the pairs (i, i + rope_dims / 2) of each head's first rope_dims dims (llama.cpp's NeoX rope:
    the first half of the rotated dims holds the pairs' first elements, the second half their seconds).

    x [n, heads, hd], cos and sin [n, rope_dims / 2] -> [n, heads, hd]
    """
    n_pairs = cos.shape[1]
    first, second = x[..., :n_pairs], x[..., n_pairs : 2 * n_pairs]  # [n, heads, rope_dims / 2] each
    cos, sin = cos[:, None, :], sin[:, None, :]  # [n, 1, rope_dims / 2]
    rotated = [first * cos - second * sin, first * sin + second * cos]  # [n, heads, rope_dims / 2] each
    return np.concatenate([*rotated, x[..., 2 * n_pairs :]], axis=-1)


def causal_attention(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, start_pos: int, scale: float, window: int = 0
) -> np.ndarray:
    """Scaled dot-product attention of a chunk's queries over the cache + chunk, masked causally.

    q [n, n_head, hd] at positions start_pos.., keys and values [T, n_head_kv, hd] at positions 0.. ->
    [n, n_head, hd]. Scores are scale * q . k. Query head h reads key/value head h // (n_head / n_head_kv)
    (grouped-query attention). window > 0: a query at p sees only keys at p - window + 1 .. p (sliding
    window, as llama.cpp's LLAMA_SWA_TYPE_STANDARD masks).
    """
    n, n_head, head_dim = q.shape
    n_total, n_head_kv, _ = keys.shape
    n_group = n_head // n_head_kv
    q = q.reshape(n, n_head_kv, n_group, head_dim).transpose(1, 2, 0, 3)  # [n_head_kv, n_group, n, hd]
    k = keys.transpose(1, 2, 0)[:, None]  # [n_head_kv, 1, hd, T]
    v = values.transpose(1, 0, 2)[:, None]  # [n_head_kv, 1, T, hd]

    scores = (q @ k) * np.float32(scale)  # [n_head_kv, n_group, n, T]
    query_pos = start_pos + np.arange(n)[:, None]  # [n, 1]
    key_pos = np.arange(n_total)[None, :]  # [1, T]
    hidden = key_pos > query_pos  # [n, T] keys after the query
    if window > 0:
        hidden |= query_pos - key_pos >= window  # keys that slid out of the window
    scores = np.where(hidden, -np.inf, scores)
    probs = softmax(scores)  # [n_head_kv, n_group, n, T]
    out = probs @ v  # [n_head_kv, n_group, n, hd]
    return out.transpose(2, 0, 1, 3).reshape(n, n_head, head_dim)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)
