"""The GPU samplers against webgguf.sampling: sample_argmax_partial + sample_argmax_final (greedy) and
sample_filtered (the full filter chain), alone ("full": one workgroup scans the logits) or after
sample_topk_partial ("candidates": the engine's plan; the chunks' best top_k when 1 <= top_k <= K_MAX,
else the same full scan).

- greedy equals numpy's argmax of the penalized logits, ties included (to the lowest id), also with the
  CPU adapters' narrow workgroups (NARROW);
- draws follow filtered_distribution: thousands of draws in one submission (the plan replayed N times,
  the output ring collecting the ids), then (1) no id outside the distribution's support, (2) every
  id likely to appear did appear, (3) a chi-squared test of the counts at significance 1e-4;
- a step updates the state as docs/ENGINE_STATE.md says; the same seed gives the same ids;
- a 262144-token vocabulary: every drawn id is in the support;
- sample_topk_partial writes each chunk's best top_k, best first, as numpy's stable argsort orders them.

The sampler kernels have no feature variants, so they run on one device (the plain feature set).
"""

import math
import struct

import numpy as np
import pytest
from gpu_helpers import upload

from webgguf.gpu import Copy, Plan
from webgguf.sampling import SamplingParams, filtered_distribution, penalize
from webgguf.selection import TOP_K_CHUNK, TOP_K_MAX
from webgguf.state import HISTORY_LEN, RNG, STATE_WORDS, pack_state

ARGMAX_CHUNK = 1024  # ids per workgroup of sample_argmax_partial


@pytest.fixture(scope="module")
def kernels(native_backends):
    from webgguf.kernels import Kernels

    return Kernels(native_backends("plain"))


class Sampler:
    """GPU buffers and plans of one sampler setup: logits, state, output ring."""

    def __init__(
        self, kernels, logits, params: SamplingParams, history=(), ring=1, path="full", narrow=False
    ):
        self.backend = kernels.backend
        self.n_vocab = len(logits)
        self.ring = ring
        state = pack_state(pos=5, n_tokens=3, token=0, params=params, history=list(history))
        # sample_filtered reads the logits 4 at a time: pad to a multiple of 4 with logits that would win
        # every draw if they were read
        padded = np.full(-(-self.n_vocab // 4) * 4, 1e30, np.float32)
        padded[: self.n_vocab] = logits
        self.logits = upload(self.backend, "logits", padded)
        self.state = upload(self.backend, "state", np.frombuffer(state, np.uint32))
        self.initial_state = upload(self.backend, "state.initial", np.frombuffer(state, np.uint32))
        self.out_ids = upload(self.backend, "out_ids", np.full(ring, 0xFFFFFFFF, np.uint32))
        n_parts = -(-self.n_vocab // ARGMAX_CHUNK)
        self.partials = self.backend.create_buffer("argmax.partials", 8 * n_parts, "storage")
        buffers = {"state": self.state, "logits": self.logits, "out_ids": self.out_ids}
        self.n_groups = -(-self.n_vocab // TOP_K_CHUNK)
        self.candidates = self.backend.create_buffer("candidates", 8 * TOP_K_MAX * self.n_groups, "storage")
        if path == "full":
            self.filtered = (
                kernels.dispatch(
                    kernels.get("sample_filtered"), "sample", 1, buffers, n_vocab=self.n_vocab, ring=ring
                ),
            )
        else:  # as Graph.sample records it
            self.filtered = (
                kernels.dispatch(
                    kernels.get("sample_topk_partial", K_MAX=TOP_K_MAX),
                    "sample.partial",
                    self.n_groups,
                    {"state": self.state, "logits": self.logits, "candidates": self.candidates},
                    n_vocab=self.n_vocab,
                ),
                kernels.dispatch(
                    kernels.get("sample_filtered", CANDIDATES=True, K_MAX=TOP_K_MAX),
                    "sample",
                    1,
                    {**buffers, "candidates": self.candidates},
                    n_vocab=self.n_vocab,
                    ring=ring,
                    chunk=TOP_K_CHUNK,
                ),
            )
        partial = kernels.dispatch(
            kernels.get("sample_argmax_partial", NARROW=narrow),
            "argmax.partial",
            n_parts,
            {"state": self.state, "logits": self.logits, "partials": self.partials},
            n_vocab=self.n_vocab,
            chunk=ARGMAX_CHUNK,
        )
        final = kernels.dispatch(
            kernels.get("sample_argmax_final"),
            "argmax.final",
            1,
            {"state": self.state, "partials": self.partials, "out_ids": self.out_ids},
            n_parts=n_parts,
            ring=ring,
        )
        self.argmax = (partial, final)

    def draw(self, n: int, *, keep_history: bool = True) -> np.ndarray:
        """n draws in one submission; keep_history restores the history words before each draw, so every
        draw sees the same penalty (the RNG and the ring step carry on).

        On the candidate path with keep_history, sample_topk_partial runs before the first draw only:
        its list is a function of the logits and the history, the same for every draw, and running it
        per draw was ~90% of these tests' time on lavapipe. That it writes the same list again is
        checked after the draws; what it writes is checked against numpy by
        test_topk_partial_writes_each_chunks_best_first."""
        first = 4 * HISTORY_LEN
        restore = Copy(self.initial_state, self.state, 4 * STATE_WORDS - first, first, first)
        if not keep_history:
            self.backend.replay(Plan("draws", self.filtered), repeat=n)
            return self.ids(min(n, self.ring))
        self.backend.replay(Plan("draws", (restore, *self.filtered)))
        if n > 1 and len(self.filtered) == 2:  # partial, final
            listed = self.backend.read(self.candidates)
            self.backend.replay(Plan("draws.final", (restore, self.filtered[1])), repeat=n - 1)
            self.backend.replay(Plan("partial.again", (restore, self.filtered[0])))
            assert self.backend.read(self.candidates) == listed, "sample_topk_partial wrote another list"
        elif n > 1:
            self.backend.replay(Plan("draws", (restore, *self.filtered)), repeat=n - 1)
        return self.ids(min(n, self.ring))

    def greedy(self) -> int:
        self.backend.replay(Plan("greedy", self.argmax))
        return int(self.ids(1)[0])

    def ids(self, n: int) -> np.ndarray:
        return np.frombuffer(self.backend.read(self.out_ids, 0, 4 * n), np.uint32).copy()

    def state_words(self) -> np.ndarray:
        return np.frombuffer(self.backend.read(self.state), np.uint32).copy()

    def close(self):
        buffers = (self.logits, self.state, self.initial_state, self.out_ids, self.partials, self.candidates)
        for buffer in buffers:
            self.backend.destroy_buffer(buffer)


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-squared(df) at the normal quantile z (3.719: significance 1e-4),
    Wilson-Hilferty approximation."""
    a = 2 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def check_draws(ids, probs):
    n = len(ids)
    support = np.flatnonzero(probs)
    outside = set(ids.tolist()) - set(support.tolist())
    assert not outside, f"drawn ids outside the filtered distribution: {sorted(outside)[:10]}"
    counts = np.bincount(ids, minlength=len(probs))[support]
    expected = n * probs[support]
    assert np.all(counts[expected >= 12] > 0), "an id with >= 12 expected draws never came up"
    # Pool the ids expected fewer than 5 times into one category.
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    wanted = np.append(expected[~small], expected[small].sum())
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]
    if len(wanted) < 2:
        return
    chi2 = float(np.sum((observed - wanted) ** 2 / wanted))
    assert chi2 < chi2_critical(len(wanted) - 1), f"chi2 {chi2:.1f} with {len(wanted) - 1} degrees of freedom"


def tied_logits(rng, n):
    """Logits on a coarse grid: many exact ties, at the top-k and top-p boundaries too."""
    return np.round(rng.standard_normal(n) * 2) / 2


CHI2_CASES = {
    # name: (n_vocab, logits, params, history)
    "top_k": (256, "normal", dict(top_k=20, top_p=1.0, min_p=0.0, temperature=1.0), ()),
    "top_p": (300, "normal", dict(top_k=0, top_p=0.8, min_p=0.0, temperature=1.0), ()),
    "min_p": (300, "normal", dict(top_k=0, top_p=1.0, min_p=0.05, temperature=1.0), ()),
    "temperature_and_defaults": (500, "normal", dict(temperature=0.6), ()),
    "pure_sampling": (200, "normal", dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.5), ()),
    "penalty": (
        256,
        "normal",
        dict(top_k=0, top_p=0.9, min_p=0.0, temperature=1.3, repeat_penalty=1.8, repeat_last_n=6),
        (3, 250, 7, 7, 100, 42, 3, 9, 11),  # the last 6: 42, 3, 9, 11, 100, 7
    ),
    "ties_top_k_top_p": (64, "tied", dict(top_k=10, top_p=0.7, min_p=0.0, temperature=1.0), ()),
    # min-p floor: top-k's cut above it (searched from it); top-k's / top-p's cut below it (min-p decides)
    "top_k_above_min_p_floor": (500, "normal", dict(top_k=40, top_p=0.9, min_p=0.01, temperature=1.0), ()),
    "top_k_below_min_p_floor": (300, "normal", dict(top_k=100, top_p=1.0, min_p=0.1, temperature=1.0), ()),
    "top_p_below_min_p_floor": (300, "normal", dict(top_k=0, top_p=0.99, min_p=0.2, temperature=1.0), ()),
}


# The candidate path: top_k from 1 to K_MAX (and K_MAX + 1: the full scan in the same plan), vocabularies
# of several chunks and not a multiple of one (the last chunk shorter than top_k too: 2048 + 30).
CANDIDATE_CASES = {
    "k1": (3000, "normal", dict(top_k=1, temperature=1.0), ()),
    "k7_ties": (2500, "tied", dict(top_k=7, top_p=1.0, min_p=0.0, temperature=1.0), ()),
    "k40_defaults": (5001, "normal", dict(temperature=0.8), ()),
    "k40_ties_top_p": (3333, "tied", dict(top_k=40, top_p=0.5, min_p=0.0, temperature=1.0), ()),
    "k_max_ties": (4100, "tied", dict(top_k=TOP_K_MAX, top_p=1.0, min_p=0.0, temperature=1.0), ()),
    "k_max_plus_1": (3000, "tied", dict(top_k=TOP_K_MAX + 1, top_p=1.0, min_p=0.0, temperature=1.0), ()),
    "short_last_chunk": (2048 + 30, "normal", dict(top_k=60, top_p=0.97, min_p=0.0, temperature=1.2), ()),
    "one_chunk": (100, "normal", dict(top_k=50, top_p=1.0, min_p=0.0, temperature=1.0), ()),
    "k_above_vocab": (90, "normal", dict(top_k=100, top_p=1.0, min_p=0.0, temperature=1.0), ()),
    "penalty": (
        3000,
        "normal",
        dict(top_k=20, top_p=0.95, min_p=0.0, temperature=1.3, repeat_penalty=1.8, repeat_last_n=6),
        (3, 2500, 7, 7, 1100, 42, 3, 2049, 11),  # the last 6: 7, 1100, 42, 3, 2049, 11
    ),
}


def case_logits(n_vocab, kind, penalized_ids=()):
    rng = np.random.default_rng(n_vocab)
    logits = tied_logits(rng, n_vocab) if kind == "tied" else rng.standard_normal(n_vocab) * 2
    logits = logits.astype(np.float32)
    if penalized_ids:
        logits[list(penalized_ids[:3])] = logits.max() + np.array([0.5, 0.3, -0.2])  # near the top
        logits[penalized_ids[3]] = logits.min() - 1  # a negative penalized logit
    return logits


@pytest.mark.parametrize("path", ["full", "candidates"])
@pytest.mark.parametrize("case", sorted(CHI2_CASES))
def test_sample_filtered_distribution(kernels, case, path):
    n_vocab, kind, settings, history = CHI2_CASES[case]
    logits = case_logits(n_vocab, kind, (42, 9, 100, 3) if case == "penalty" else ())
    params = SamplingParams(seed=n_vocab, **settings)
    probs = filtered_distribution(logits, params, list(history))
    n_draws = 2000
    sampler = Sampler(kernels, logits, params, history, ring=n_draws, path=path)
    ids = sampler.draw(n_draws)
    sampler.close()
    check_draws(ids, probs)


@pytest.mark.parametrize("case", sorted(CANDIDATE_CASES))
def test_candidate_path_distribution(kernels, case):
    n_vocab, kind, settings, history = CANDIDATE_CASES[case]
    logits = case_logits(n_vocab, kind, (42, 2049, 1100, 3) if case == "penalty" else ())
    params = SamplingParams(seed=n_vocab, **settings)
    probs = filtered_distribution(logits, params, list(history))
    n_draws = 2000
    sampler = Sampler(kernels, logits, params, history, ring=n_draws, path="candidates")
    ids = sampler.draw(n_draws)
    sampler.close()
    check_draws(ids, probs)


@pytest.mark.parametrize("top_k", [1, 13, TOP_K_MAX])
def test_topk_partial_writes_each_chunks_best_first(kernels, top_k):
    """The candidate list against numpy: per chunk, the stable argsort of the penalized logits, negated."""
    n_vocab = 3 * TOP_K_CHUNK + 77
    logits = case_logits(n_vocab, "tied", (5, 1030, 3100, 9))  # ties everywhere, penalized ids in 3 chunks
    history = [9, 3100, 5, 1030]
    params = SamplingParams(top_k=top_k, temperature=1.0, repeat_penalty=1.5, repeat_last_n=4)
    sampler = Sampler(kernels, logits, params, history, path="candidates")
    sampler.backend.replay(Plan("partial", sampler.filtered[:1]))
    words = np.frombuffer(sampler.backend.read(sampler.candidates), np.uint32)
    sampler.close()
    got = words[: 2 * top_k * sampler.n_groups].reshape(sampler.n_groups, top_k, 2)
    penalized = penalize(logits, params, history).astype(np.float32)
    for g in range(sampler.n_groups):
        chunk = penalized[g * TOP_K_CHUNK : (g + 1) * TOP_K_CHUNK]
        want = g * TOP_K_CHUNK + np.argsort(-chunk, kind="stable")[:top_k]
        n = len(want)
        assert got[g, :n, 1].tolist() == want.tolist(), f"chunk {g}"
        assert np.all(got[g, n:, 1] == 0xFFFFFFFF)  # slots past a short last chunk: no token
        keys = got[g, :n, 0]
        values = np.where(keys & 0x80000000, keys & 0x7FFFFFFF, ~keys).astype(np.uint32).view(np.float32)
        assert np.array_equal(values, penalized[want])


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_candidate_path_ties_across_chunks_keep_the_lowest_ids(kernels, top_k):
    """A run of equal logits spread over 4 chunks: top-k keeps its lowest ids, like numpy's stable sort."""
    logits = np.zeros(4 * TOP_K_CHUNK - 3, np.float32)
    run = [4000, 3000, 2047, 1024, 1023, 5]  # id order: 5, 1023, 1024, 2047, 3000, 4000
    logits[run] = 2.0
    params = SamplingParams(top_k=top_k, top_p=1.0, min_p=0.0, temperature=1.0)
    probs = filtered_distribution(logits, params, [])
    support = set(np.flatnonzero(probs).tolist())
    assert support == set(sorted(run)[:top_k])
    sampler = Sampler(kernels, logits, params, ring=300, path="candidates")
    ids = sampler.draw(300)
    sampler.close()
    assert set(ids.tolist()) == support
    check_draws(ids, probs)


def test_sample_filtered_support_with_ties_is_exact(kernels):
    """top-k through a run of tied logits keeps the lowest ids of the run, like numpy's stable sort."""
    logits = np.zeros(40, np.float32)
    logits[[5, 30]] = 3.0
    logits[[2, 8, 17, 25, 33]] = 1.0  # top_k = 4 keeps ids 2 and 8 of this run
    params = SamplingParams(top_k=4, top_p=1.0, min_p=0.0, temperature=1.0)
    probs = filtered_distribution(logits, params, [])
    assert set(np.flatnonzero(probs)) == {2, 5, 8, 30}
    sampler = Sampler(kernels, logits, params, ring=600)
    ids = sampler.draw(600)
    sampler.close()
    assert set(ids.tolist()) == {2, 5, 8, 30}
    check_draws(ids, probs)


def test_top_p_weighs_the_whole_top_k_set_below_the_min_p_floor(kernels):
    """top-k's 25 include 20 tokens below the min-p floor: top-p's mass must count them (a search for
    the top-k cut that started at the floor would miss them and cut top-p after 3 tokens, not 5)."""
    logits = np.full(100, -5.0, np.float32)
    logits[[10, 50, 3, 87, 31]] = [1.9, 1.8, 1.7, 1.6, 1.5]
    logits[60:80] = 0.3
    params = SamplingParams(top_k=25, top_p=0.47, min_p=0.3, temperature=1.0)
    probs = filtered_distribution(logits, params, [])
    assert set(np.flatnonzero(probs)) == {10, 50, 3, 87, 31}
    sampler = Sampler(kernels, logits, params, ring=800)
    ids = sampler.draw(800)
    sampler.close()
    assert set(ids.tolist()) == {10, 50, 3, 87, 31}
    check_draws(ids, probs)


@pytest.mark.parametrize("n_vocab", [1, 50, 3000])
def test_greedy_is_numpy_argmax_with_ties(kernels, n_vocab):
    rng = np.random.default_rng(n_vocab)
    logits = rng.standard_normal(n_vocab).astype(np.float32)
    top = logits.max() + 1
    tied = sorted({n_vocab - 1, n_vocab // 2, min(n_vocab - 1, 1100)})  # across argmax chunks
    logits[tied] = top
    params = SamplingParams(temperature=0.0)
    for kernel_path in ("argmax", "argmax_narrow", "filtered"):
        sampler = Sampler(kernels, logits, params, narrow=kernel_path == "argmax_narrow")
        token = int(sampler.draw(1)[0]) if kernel_path == "filtered" else sampler.greedy()
        sampler.close()
        assert token == int(np.argmax(logits)) == tied[0], kernel_path


def test_greedy_uses_the_penalized_logits(kernels):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(5000).astype(np.float32)
    logits[4321] = 10.0  # the best, but recent: 10 / 4 = 2.5 loses to 5.0
    logits[17] = 5.0
    logits[2500] = -0.1  # recent and negative: -0.1 * 4 stays below
    params = SamplingParams(temperature=0.0, repeat_penalty=4.0, repeat_last_n=3)
    history = [4321, 5, 6, 2500, 4321]  # the last 3: 6, 2500, 4321
    want = int(np.argmax(filtered_distribution(logits, params, history)))
    assert want == 17
    for kernel_path in ("argmax", "argmax_narrow", "filtered"):
        sampler = Sampler(kernels, logits, params, history, narrow=kernel_path == "argmax_narrow")
        token = int(sampler.draw(1)[0]) if kernel_path == "filtered" else sampler.greedy()
        sampler.close()
        assert token == want, kernel_path


def test_a_step_updates_the_state(kernels):
    logits = np.arange(10, dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=3, seed=7)
    sampler = Sampler(kernels, logits, params, history=[1, 2], ring=4)
    before = sampler.state_words()
    ring = sampler.draw(6, keep_history=False)  # 6 steps wrap the 4-slot ring
    after = sampler.state_words()
    sampler.close()
    drawn = after[18:24]  # the history ring: the prompt tail 1, 2, then the drawn ids
    assert list(after[16:18]) == [1, 2]
    assert set(drawn.tolist()) <= {7, 8, 9}
    assert ring.tolist() == drawn[[4, 5, 2, 3]].tolist()  # slot = step % ring
    assert after[2] == drawn[-1]  # state[TOKEN]: the next step's embedding lookup reads it
    # pos moved past the 3 prompt tokens, then one per decode step; n_tokens, step, history_len, head
    assert (after[0], after[1], after[3], after[11], after[12]) == (5 + 3 + 5, 1, 6, 8, 8)
    assert after[RNG] != before[RNG]


def test_same_seed_same_ids(kernels):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(1000).astype(np.float32)
    runs = []
    for seed in (11, 11, 12):
        params = SamplingParams(temperature=1.0, top_k=0, top_p=0.95, seed=seed)
        sampler = Sampler(kernels, logits, params, ring=32)
        runs.append(sampler.draw(32).tolist())
        sampler.close()
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("path", ["full", "candidates"])
def test_large_vocab_draws_stay_in_the_support(kernels, path):
    rng = np.random.default_rng(262144)
    logits = (rng.standard_normal(262144) * 3).astype(np.float32)
    for settings in (dict(temperature=0.8), dict(temperature=1.0, top_k=0, top_p=0.3, min_p=0.0)):
        params = SamplingParams(**settings)
        support = set(np.flatnonzero(filtered_distribution(logits, params, [])).tolist())
        sampler = Sampler(kernels, logits, params, ring=4, path=path)
        ids = sampler.draw(4)
        sampler.close()
        assert set(ids.tolist()) <= support


def test_many_chunks_candidate_path_distribution(kernels):
    """17 chunks (the last one of 5 ids), top_k 40 with a flat top spread over them: chi-squared. (Fewer
    chunks than Gemma's 256 keep it quick on lavapipe; the 262144-token case above checks the support.)"""
    n_vocab = 16 * TOP_K_CHUNK + 5
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    logits[rng.choice(n_vocab, 60, replace=False)] = logits.max() + rng.random(60).astype(np.float32)
    logits[n_vocab - 2] = logits.max() + 0.5  # the best token in the short last chunk
    params = SamplingParams(top_k=40, top_p=1.0, min_p=0.0, temperature=1.0, seed=5)
    probs = filtered_distribution(logits, params, [])
    sampler = Sampler(kernels, logits, params, ring=1000, path="candidates")
    ids = sampler.draw(1000)
    sampler.close()
    check_draws(ids, probs)


def test_candidate_path_draws_from_the_list(kernels):
    """With 1 <= top_k <= K_MAX, sample_filtered reads sample_topk_partial's list, not the logits: given a
    hand-written list (the logits all 0), it keeps the list's global top-k."""
    logits = np.zeros(2 * TOP_K_CHUNK, np.float32)
    params = SamplingParams(top_k=2, top_p=1.0, min_p=0.0, temperature=1.0)
    sampler = Sampler(kernels, logits, params, ring=400, path="candidates")
    values = np.array([3.0, 1.0, 2.0, 0.5], np.float32)  # chunk 0: ids 7, 9; chunk 1: ids 1500, 1600
    keys = values.view(np.uint32) | 0x80000000  # order keys of positive logits
    listed = np.stack([keys, np.array([7, 9, 1500, 1600], np.uint32)], axis=1)
    sampler.backend.write_buffer(sampler.candidates, listed.tobytes())
    sampler.filtered = sampler.filtered[1:]  # the final kernel only
    ids = sampler.draw(400)
    sampler.close()
    assert set(ids.tolist()) == {7, 1500}
    probs = np.zeros(len(logits))
    probs[[7, 1500]] = np.exp([3.0, 2.0]) / np.exp([3.0, 2.0]).sum()
    check_draws(ids, probs)


def test_state_words_of_pack_state_match_the_kernels():
    """The sampler reads the f32 settings as bit patterns at the documented words."""
    params = SamplingParams(temperature=0.5, top_p=0.25, min_p=0.125, repeat_penalty=2.0)
    state = pack_state(0, 1, 0, params, [])
    words = struct.unpack("<16I", state[:64])
    floats = struct.unpack("<16f", state[:64])
    settings = (floats[5], words[6], floats[7], floats[8], floats[9], words[10])
    assert settings == (0.5, 40, 0.25, 0.125, 2.0, 64)
