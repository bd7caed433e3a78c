"""Sampling parameters and the numpy sampler (the reference the GPU sampler is checked against).

The filter chain follows llama.cpp's default order, so the same settings mean the same thing:
  repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw.
temperature == 0 means greedy (argmax of the penalized logits). top_k == 0, top_p == 1 and
min_p == 0 disable their filter; repeat_penalty == 1 disables the penalty.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = 0

    def __post_init__(self):
        _check(self.temperature >= 0 and self.temperature <= 100, "temperature must be in [0, 100]")
        _check(self.top_k >= 0, "top_k must be >= 0 (0 disables it)")
        _check(0 < self.top_p <= 1, "top_p must be in (0, 1]")
        _check(0 <= self.min_p < 1, "min_p must be in [0, 1)")
        _check(0 < self.repeat_penalty <= 10, "repeat_penalty must be in (0, 10]")
        _check(0 <= self.repeat_last_n <= 4096, "repeat_last_n must be in [0, 4096]")
        _check(0 <= self.seed < 2**32, "seed must be in [0, 2^32)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check(ok: bool, message: str):
    if not ok:
        raise ValueError(message)


def penalize(logits, params: SamplingParams, history: list[int]):
    """Repetition penalty on the last `repeat_last_n` tokens (each token once), as llama.cpp does it."""
    import numpy as np

    logits = np.array(logits, dtype=np.float32)  # [n_vocab], a copy
    if params.repeat_penalty != 1 and params.repeat_last_n > 0 and history:
        recent = np.unique(np.asarray(history[-params.repeat_last_n :], dtype=np.int64))
        values = logits[recent]
        logits[recent] = np.where(values > 0, values / params.repeat_penalty, values * params.repeat_penalty)
    return logits


def filtered_distribution(logits, params: SamplingParams, history: list[int]):
    """The exact distribution a token is drawn from: float64 probabilities [n_vocab], 0 outside the filter."""
    import numpy as np

    logits = penalize(logits, params, history).astype(np.float64)
    n_vocab = logits.shape[0]
    if params.greedy:
        probs = np.zeros(n_vocab)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    order = np.argsort(-logits, kind="stable")  # candidates, best first
    if params.top_k > 0:
        order = order[: params.top_k]
    cand = logits[order]
    p = np.exp(cand - cand[0])
    p /= p.sum()
    if params.top_p < 1:
        # keep the smallest prefix whose mass reaches top_p (at least one token)
        keep = int(np.searchsorted(np.cumsum(p), params.top_p) + 1)
        order, cand, p = order[:keep], cand[:keep], p[:keep]
    if params.min_p > 0:
        keep = p >= params.min_p * p[0]
        order, cand = order[keep], cand[keep]
    scaled = cand / params.temperature
    q = np.exp(scaled - scaled.max())
    probs = np.zeros(n_vocab)
    probs[order] = q / q.sum()
    return probs


def sample(logits, params: SamplingParams, history: list[int], rng) -> int:
    """Draw one token id from the filtered distribution with a numpy Generator `rng`."""
    probs = filtered_distribution(logits, params, history)
    if params.greedy:
        return int(probs.argmax())
    return int(rng.choice(probs.shape[0], p=probs))
