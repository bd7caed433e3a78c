import numpy as np
import pytest

from webgguf.sampling import SamplingParams, filtered_distribution, penalize, sample

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0], dtype=np.float32)


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_greedy_is_argmax_with_lowest_id_on_ties():
    probs = filtered_distribution(np.array([1.0, 3.0, 3.0]), SamplingParams(temperature=0), [])
    assert probs.tolist() == [0, 1, 0]


def test_no_filters_is_softmax_of_tempered_logits():
    params = SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)
    np.testing.assert_allclose(
        filtered_distribution(LOGITS, params, []), softmax(LOGITS.astype(np.float64) / 0.7), rtol=1e-12
    )


def test_top_k_keeps_the_k_best():
    probs = filtered_distribution(LOGITS, SamplingParams(temperature=1, top_k=2, top_p=1, min_p=0), [])
    expected = np.zeros(6)
    expected[[3, 0]] = softmax(np.array([3.0, 2.0]))
    np.testing.assert_allclose(probs, expected, rtol=1e-12)


def test_top_p_keeps_smallest_prefix_reaching_p():
    p = softmax(LOGITS.astype(np.float64))
    order = np.argsort(-p)
    cut = 0.8
    n_keep = int(np.searchsorted(np.cumsum(p[order]), cut) + 1)
    kept = order[:n_keep]
    probs = filtered_distribution(LOGITS, SamplingParams(temperature=1, top_k=0, top_p=cut, min_p=0), [])
    assert set(np.nonzero(probs)[0]) == set(kept)
    np.testing.assert_allclose(probs[kept], softmax(LOGITS[kept].astype(np.float64)), rtol=1e-12)


def test_min_p_is_relative_to_the_best():
    params = SamplingParams(temperature=1, top_k=0, top_p=1, min_p=0.3)
    probs = filtered_distribution(LOGITS, params, [])
    p = softmax(LOGITS.astype(np.float64))
    assert set(np.nonzero(probs)[0]) == set(np.nonzero(p >= 0.3 * p.max())[0])


def test_repetition_penalty_divides_positive_and_multiplies_negative_once():
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=3)
    out = penalize(LOGITS, params, [4, 0, 0, 1])  # window: 0, 0, 1
    assert out[0] == 1.0 and out[1] == 0.5 and out[4] == -1.0 and out[3] == 3.0
    out = penalize(LOGITS, params, [0, 4])
    assert out[4] == -2.0


def test_seeded_sampling_is_reproducible_and_follows_the_filtered_distribution():
    params = SamplingParams(temperature=1.0, top_k=3, top_p=1, min_p=0, seed=7)

    def draws(seed: int, n: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return [sample(LOGITS, params, [], rng) for _ in range(n)]

    assert draws(7, 50) == draws(7, 50)
    assert draws(7, 50) != draws(8, 50)
    # 3000 draws: exactly the top-3 ids come up, at their probabilities (a chi-squared test with 2
    # degrees of freedom at significance 1e-4: 2 ln 1e4). The seed is fixed: the outcome is too.
    n, kept = 3000, [3, 0, 1]
    counts = np.bincount(draws(1, n), minlength=len(LOGITS))
    assert set(np.flatnonzero(counts)) == set(kept)
    expected = n * filtered_distribution(LOGITS, params, [])[kept]
    np.testing.assert_allclose(expected / n, softmax(LOGITS[kept].astype(np.float64)), rtol=1e-12)
    chi2 = float(np.sum((counts[kept] - expected) ** 2 / expected))
    assert chi2 < 2 * np.log(1e4), (counts[kept], expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"top_k": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"min_p": 1},
        {"repeat_penalty": 0},
        {"seed": -1},
        {"temperature": float("nan")},
    ],
)
def test_bad_parameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
