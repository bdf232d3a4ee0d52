"""Lossy acceptance rules, exactly: every random outcome enumerated and compared with the
distribution `lossy`'s docstring states; the rules' thresholds by hand; and the proof that they
are lossy (their output is not p), which is why they are flagged."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.backends.torch_hf import TorchLM
from specwise.drafters import ModelDrafter, NgramDrafter
from specwise.lossy import check_rule, keep_rule, lossy_sample, top_n, typical
from toy import enumerate_outcomes, tiny_llama

ROWS = np.array(
    [
        [0.5, 0.3, 0.15, 0.05],
        [0.25, 0.25, 0.25, 0.25],
        [0.97, 0.01, 0.01, 0.01],
        [0.0, 0.6, 0.4, 0.0],
    ]
)


def stated(draft, p, keep) -> dict[tuple[int, ...], float]:
    """The output distribution the module docstring states, computed directly."""
    out: dict[tuple[int, ...], float] = {}
    for i, x in enumerate(draft):
        if keep(p[i], x):
            continue
        for y in range(p.shape[1]):
            if y != x and p[i][y] > 0:
                out[(*draft[:i], y)] = p[i][y] / (1.0 - p[i][x])
        return out
    for y in range(p.shape[1]):
        if p[len(draft)][y] > 0:
            out[(*draft, y)] = p[len(draft)][y]
    return out


@pytest.mark.parametrize("rule", ["typical", "top-1", "top-2", "top-3"])
@pytest.mark.parametrize("order", list(itertools.permutations(range(4), 3))[::3])
@pytest.mark.parametrize("draft", [(0, 1), (1, 2), (3, 0), (2, 2)])
def test_every_outcome_has_the_stated_probability(rule, order, draft):
    p = ROWS[list(order)]  # three positions: the draft's two and the bonus's
    keep = keep_rule(rule)
    got = enumerate_outcomes(lambda s: tuple(lossy_sample(draft, p, s, keep).tokens))
    want = stated(draft, p, keep)
    assert got.keys() == want.keys()
    for seq, prob in want.items():
        assert got[seq] == pytest.approx(prob, abs=1e-12)


def test_typical_lowers_its_bar_where_p_is_flat():
    flat, peaked = ROWS[1], ROWS[2]  # bar 0.3·e^(−ln 4) = 0.075; bar min(0.09, 0.3·e^(−H)) = 0.09
    assert all(typical(flat, x) for x in range(4))
    assert typical(peaked, 0) and not typical(peaked, 1)
    assert typical(ROWS[0], 3) is False and typical(ROWS[0], 2) is True


def test_top_n_counts_ties_and_never_keeps_an_impossible_token():
    p = np.array([0.4, 0.2, 0.2, 0.2, 0.0])
    assert [top_n(2)(p, x) for x in range(5)] == [True, True, True, True, False]
    assert [top_n(1)(p, x) for x in range(5)] == [True, False, False, False, False]
    assert not top_n(9)(p, 4)


def test_the_rules_are_lossy_which_is_why_they_are_flagged():
    # One position, draft token 1 (p = 0.3): top-2 keeps it always, so the first token is 1
    # with probability 1 where the target says 0.3.
    p = ROWS[[0, 0]]
    dist = enumerate_outcomes(lambda s: lossy_sample([1], p, s, keep_rule("top-2")).tokens[0])
    assert dist == {1: 1.0} and p[0][1] == 0.3


@pytest.mark.parametrize("bad", ["", "typical2", "top-0", "top-x", "lossless", "TOP-2"])
def test_an_unknown_rule_is_one_clear_sentence(bad):
    with pytest.raises(ValueError, match="is not a rule; use exact"):
        check_rule(bad)


def test_known_rules_pass():
    assert [check_rule(n) for n in ("exact", "typical", "top-1", "top-20")] == [
        "exact",
        "typical",
        "top-1",
        "top-20",
    ]


PROMPT = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]


@pytest.fixture(scope="module")
def target():
    return TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0))


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_a_lossy_request_flags_every_round_and_its_summary(target, kind):
    drafter = NgramDrafter() if kind == "ngram" else ModelDrafter(TorchLM(target.model))
    eng = Engine(target, drafter, k=3)
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=24)
    lossy = eng.finish(_run(eng, params, "top-3"))
    exact = eng.generate(PROMPT, params)
    assert lossy.summary.acceptance == "top-3" and exact.summary.acceptance == "exact"
    assert {r.acceptance for r in lossy.rounds} == {"top-3"}
    assert {r.acceptance for r in exact.rounds} == {None}
    assert any(r.proposed for r in lossy.rounds) and lossy.summary.emitted == 24


def _run(eng, params, acceptance):
    req = eng.start(PROMPT, params, acceptance=acceptance)
    while not req.done:
        eng.step([req])
    return req


def test_a_lossy_rule_is_refused_for_greedy_requests_and_by_an_unknown_name(target):
    eng = Engine(target, NgramDrafter(), k=3)
    with pytest.raises(ValueError, match="sampled requests"):
        eng.start(PROMPT, SamplingParams(), acceptance="typical")
    with pytest.raises(ValueError, match="is not a rule"):
        eng.start(PROMPT, SamplingParams(temperature=1.0), acceptance="nearly")
    assert target.in_use() == 0  # nothing was left holding a cache
