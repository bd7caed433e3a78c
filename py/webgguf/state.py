"""The engine state buffer: its word layout (docs/ENGINE_STATE.md; shaders/lib/state.wgsl is the WGSL
side) and the bytes the host writes into it."""

from __future__ import annotations

import struct

POS, N_TOKENS, TOKEN, STEP, RNG = 0, 1, 2, 3, 4
TEMPERATURE, TOP_K, TOP_P, MIN_P, REPEAT_PENALTY, REPEAT_LAST_N = 5, 6, 7, 8, 9, 10
HISTORY_LEN, HISTORY_HEAD, HISTORY = 11, 12, 16
HISTORY_CAP = 256
STATE_WORDS = HISTORY + HISTORY_CAP


def pack_state(pos: int, n_tokens: int, token: int, params, history: list[int], step: int = 0) -> bytes:
    """The state words for the start of a generation (history: the prompt's last tokens)."""
    history = history[-HISTORY_CAP:]
    words = [0] * STATE_WORDS
    words[POS], words[N_TOKENS], words[TOKEN], words[STEP] = pos, n_tokens, token, step
    words[RNG] = _seed_state(params.seed)
    words[TOP_K], words[REPEAT_LAST_N] = params.top_k, min(params.repeat_last_n, HISTORY_CAP)
    words[HISTORY_LEN], words[HISTORY_HEAD] = len(history), len(history) % HISTORY_CAP
    words[HISTORY : HISTORY + len(history)] = history
    data = bytearray(struct.pack(f"<{STATE_WORDS}I", *words))
    for index, value in (
        (TEMPERATURE, params.temperature),
        (TOP_P, params.top_p),
        (MIN_P, params.min_p),
        (REPEAT_PENALTY, params.repeat_penalty),
    ):
        struct.pack_into("<f", data, 4 * index, value)
    return bytes(data)


# Before each prefill chunk the host writes the chunk's first position and its length: words POS and
# N_TOKENS, which are adjacent, in one write at this byte offset.
POSITION_OFFSET = 4 * POS
assert N_TOKENS == POS + 1


def pack_position(pos: int, n_tokens: int) -> bytes:
    """The words POS and N_TOKENS (write them at POSITION_OFFSET)."""
    return struct.pack("<2I", pos, n_tokens)


def _seed_state(seed: int) -> int:
    """A nonzero 32-bit RNG state from the user's seed (splitmix-style scramble)."""
    z = (seed + 0x9E3779B9) & 0xFFFFFFFF
    z = ((z ^ (z >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    z = ((z ^ (z >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return (z ^ (z >> 16)) or 1
