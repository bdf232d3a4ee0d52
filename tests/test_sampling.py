from __future__ import annotations

import numpy as np
import pytest

from specwise import sampling
from specwise.sampling import LazyRows, Sampler, SamplingParams, warp


def reference_warp(logits, t, top_k=0, top_p=1.0, min_p=0.0):
    """Plain-Python warping, one step at a time, for small vocabularies."""
    v = len(logits)
    if t == 0:
        out = [0.0] * v
        out[max(range(v), key=lambda i: (logits[i], -i))] = 1.0
        return np.array(out)
    z = [x / t for x in logits]
    keep = set(range(v))
    if 0 < top_k < v:
        kth = sorted(z, reverse=True)[top_k - 1]
        keep = {i for i in keep if z[i] >= kth}

    def norm(keep):
        m = max(z[i] for i in keep)
        e = {i: np.exp(z[i] - m) for i in keep}
        s = sum(e.values())
        return {i: e[i] / s for i in keep}

    probs = norm(keep)
    if top_p < 1.0:
        order = sorted(keep, key=lambda i: (-probs[i], i))
        cum, kept = 0.0, set()
        for i in order:
            kept.add(i)
            cum += probs[i]
            if cum >= top_p:
                break
        keep = kept
        probs = norm(keep)
    if min_p > 0:
        top = max(probs.values())
        keep = {i for i in keep if probs[i] >= min_p * top}
        probs = norm(keep)
    return np.array([probs.get(i, 0.0) for i in range(v)])


@pytest.mark.parametrize(
    "kw",
    [
        dict(t=0.0),
        dict(t=1.0),
        dict(t=0.5),
        dict(t=2.0, top_k=3),
        dict(t=1.0, top_p=0.8),
        dict(t=0.7, top_k=5, top_p=0.6),
        dict(t=1.0, min_p=0.2),
        dict(t=1.3, top_k=6, top_p=0.9, min_p=0.1),
    ],
)
def test_warp_matches_reference(kw):
    rng = np.random.default_rng(0)
    params = SamplingParams(
        temperature=kw["t"],
        top_k=kw.get("top_k", 0),
        top_p=kw.get("top_p", 1.0),
        min_p=kw.get("min_p", 0.0),
    )
    for _ in range(50):
        logits = rng.standard_normal(8) * 2
        got = warp(logits, params)
        want = reference_warp(list(logits), **kw)
        np.testing.assert_allclose(got, want, atol=1e-12)
        assert abs(got.sum() - 1) < 1e-12


def test_ties_top_k_keeps_all_tied_and_top_p_prefers_lower_ids():
    logits = np.array([1.0, 3.0, 3.0, 3.0, 0.0])
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p > 0).tolist() == [False, True, True, True, False]
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert (p > 0).tolist() == [False, True, True, False, False]


def test_greedy_is_one_hot_at_first_argmax():
    p = warp(np.array([0.0, 2.0, 2.0, 1.0]), SamplingParams())
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_2d_rows_and_lazy_rows_agree():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 10)).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_p=0.9)
    full = warp(logits, params)
    lazy = LazyRows(logits, params)
    for i in range(3):
        np.testing.assert_array_equal(lazy[i], full[i])
    assert len(lazy) == 3


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99, 0.999999])
def test_top_p_candidate_fast_path_equals_full_sort(monkeypatch, top_p):
    rng = np.random.default_rng(2)
    for scale in (0.5, 3.0, 8.0):
        logits = rng.standard_normal(5000) * scale
        fast = warp(logits, SamplingParams(temperature=1.0, top_p=top_p))
        monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 10**9)
        full = warp(logits, SamplingParams(temperature=1.0, top_p=top_p))
        monkeypatch.undo()
        np.testing.assert_array_equal(fast, full)


def test_top_p_fast_path_falls_back_on_ties_at_the_edge(monkeypatch):
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 4)
    logits = np.zeros(10)  # ten-way tie: any candidate subset would be ambiguous
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.35))
    assert (p > 0).tolist() == [True] * 4 + [False] * 6


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=2), "min_p"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.0), "seed"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(stop=[""]), "stop"),
        (dict(stop=[1]), "stop"),
    ],
)
def test_invalid_params_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} = .* must be"):
        SamplingParams(**kw)


def test_params_normalise_types():
    p = SamplingParams(temperature=1, stop=["a", "b"], seed=np.int64(3))
    assert p.temperature == 1.0 and isinstance(p.temperature, float)
    assert p.stop == ("a", "b") and p.seed == 3
    assert SamplingParams(stop="x").stop == ("x",)
    with pytest.raises(AttributeError):
        p.temperature = 2.0  # frozen


def test_sampler_is_reproducible_and_never_draws_zero_mass():
    probs = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    a = [Sampler(5).categorical(probs) for _ in range(3)]
    s1, s2 = Sampler(7), Sampler(7)
    assert [s1.categorical(probs) for _ in range(50)] == [s2.categorical(probs) for _ in range(50)]
    s = Sampler(0)
    draws = {s.categorical(probs) for _ in range(2000)}
    assert draws == {1, 3}
    assert len(set(a)) == 1


def test_sampler_bernoulli_draws_nothing_when_certain():
    s1, s2 = Sampler(11), Sampler(11)
    assert s1.bernoulli(1.0) and not s1.bernoulli(0.0)
    assert s1.categorical(np.ones(4)) == s2.categorical(np.ones(4))


@pytest.mark.parametrize("t", [5e-324, 2.2250738585072014e-308, 1e-300])
def test_a_tiny_temperature_warps_to_its_limit_not_to_nan(t):
    """logits / t would overflow to inf (and the softmax to NaN, which no token can be drawn
    from); the limit of a temperature going to 0 is the argmax, with ties shared."""
    logits = np.array([1.0, 30.0, -5.0, 30.0, 2.0])
    p = warp(logits, SamplingParams(temperature=t))
    np.testing.assert_array_equal(p, [0.0, 0.5, 0.0, 0.5, 0.0])
    assert Sampler(0).categorical(p) in (1, 3)
