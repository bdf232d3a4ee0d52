"""Tree drafts end to end: the suffix drafter's trees, the engine scoring a tree in one call and
keeping the accepted path, greedy equality and the exact distribution with trees, and the
controller's expectation and learning for trees. (The tree acceptance rules are enumerated in
test_verify_exact.py; a backend's tree forward is tested in test_llama_cpp.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.acceptance import expected_tokens, positions, reached
from specwise.backends.curves import CostCurve
from specwise.controller import Controller
from specwise.costs import CostModel
from specwise.drafters.base import Draft
from specwise.drafters.suffix import SuffixDrafter
from specwise.drafters.suffix_index import Occurrences, chain, tree
from specwise.oracle import plain_decode
from test_distribution import chi2_pvalue, exact_joint, sampled_counts
from toy import StubDrafter, ToyLM


class RandomTrees(StubDrafter):
    """A drafter of random point-mass trees (parents before children, distinct siblings), so
    that every shape and every outcome of verification occurs."""

    name, cheap, fingerprint = "trees", True, "trees"

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def bind(self, target):
        assert target.trees

    def propose(self, seq, context, k, params, sampler, keep_going=None):
        tokens, parents, used = [], [], {}
        for i in range(int(self.rng.integers(0, k + 1))):
            q = int(self.rng.integers(-1, i))
            free = sorted(set(range(self.vocab)) - used.setdefault(q, set()))
            if not free:
                break
            t = int(self.rng.choice(free))
            used[q].add(t)
            tokens.append(t)
            parents.append(q)
        return Draft(tokens, None, [0.5] * len(tokens), parents).prefix(len(tokens))


def occurrences(text, ends, length=2):
    return Occurrences(length, np.array(text, np.int32), np.array(ends, np.int64))


def test_tree_grows_best_first_and_one_branch_is_the_chain():
    # after [1 2]: 3 4 5 twice, 3 6 once, 7 once (the most recent)
    text = [1, 2, 3, 4, 5, -1, 1, 2, 3, 4, 5, -1, 1, 2, 3, 6, -1, 1, 2, 7]
    found = [occurrences(text, [1, 7, 13, 18])]
    tokens, parents, conf = tree(found, 6, branches=3)
    # path scores: 3 .375, 3-4 .15, 7 .125, 3-4-5 .1, 3-6 .075
    assert tokens == [3, 4, 7, 5, 6] and parents == [-1, 0, -1, 1, 0]
    assert conf[0] == pytest.approx(3 / 4 * 2 / 4) and conf[2] == pytest.approx(1 / 4 * 2 / 4)
    assert conf[1] == pytest.approx(2 / 3 * 3 / 5) and conf[4] == pytest.approx(1 / 3 * 3 / 5)
    assert conf[3] == pytest.approx(2 / 2 * 4 / 6)
    path = [np.prod([conf[j] for j in _path(parents, i)]) for i in range(len(tokens))]
    assert path == sorted(path, reverse=True)  # best first: every prefix is the best tree
    assert chain(found, 6) == ([3, 4, 5], [conf[0], conf[1], conf[3]])
    assert tree(found, 6, branches=1)[1] == [-1, 0, 1]
    assert tree(found, 2, branches=3)[:2] == ([3, 4], [-1, 0])


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out


def test_the_suffix_drafter_offers_trees_only_to_a_target_that_takes_them():
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 6, 1, 2]
    d = SuffixDrafter(scope="request")
    lm = ToyLM(vocab=12)
    d.bind(lm)
    d.begin(0, prompt)
    got = d.propose(0, prompt, 3, SamplingParams(), None)
    assert got.parents == [-1, 0, 0] and got.tokens == [3, 6, 4]  # 3, then 6 (recent) or 4
    lm.trees = False
    d.bind(lm)
    assert d.propose(0, prompt, 4, SamplingParams(), None).parents is None
    with pytest.raises(ValueError, match="branches"):
        SuffixDrafter(branches=0)


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8], [1, 1, 1, 1]]


@pytest.mark.parametrize("k", [2, 3, 6])
def test_greedy_with_trees_equals_plain_decoding(k):
    for seed, prompt in enumerate(PROMPTS):
        target = ToyLM(vocab=10, seed=seed, scale=3.0)
        params = SamplingParams(max_tokens=40)
        want = plain_decode(target, prompt, params)
        got = Engine(target, RandomTrees(10, seed), k=k).generate(prompt, params)
        assert got.tokens == want
        trees = [r for r in got.rounds if r.depth is not None]
        assert trees and all(r.accepted <= r.depth <= r.proposed for r in trees)
        assert not target.caches and not target.pending  # released, no tree left behind


def test_the_suffix_drafter_with_trees_equals_plain_decoding():
    target = ToyLM(vocab=6, seed=3, scale=4.0)
    prompt = [1, 2, 3, 4, 1, 2, 5, 4, 1, 2, 3, 4, 1, 2]
    params = SamplingParams(max_tokens=60)
    got = Engine(target, SuffixDrafter(scope="request"), k=5).generate(prompt, params)
    assert got.tokens == plain_decode(target, prompt, params)
    assert any(r.depth is not None for r in got.rounds)


def test_sampling_with_trees_emits_exactly_the_target_distribution():
    target = ToyLM(vocab=12, seed=1)
    params = SamplingParams(temperature=1.0, top_k=6)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    engine = Engine(target, RandomTrees(12, seed=7), k=4)
    n = 4000
    counts = sampled_counts(engine, prompt, params, n)
    assert chi2_pvalue(counts, exact_joint(target, prompt, params), n) > 1e-3


def test_expected_tokens_of_a_tree_and_what_verification_reached():
    # root children 0 (a=0.5) and 1 (0.4); 2 under 0 (0.5)
    assert expected_tokens([0.5, 0.4, 0.5], [-1, -1, 0]) == pytest.approx([1, 1.5, 1.9, 2.15])
    assert expected_tokens([0.5, 0.5]) == expected_tokens([0.5, 0.5], [-1, 0])
    assert positions([-1, -1, 0, 2], 4) == [0, 0, 1, 2] and positions(None, 3) == [0, 1, 2]
    assert reached([-1, -1, 0, 2], [0]) == [(0, True), (1, False), (2, False)]
    assert reached([-1, 0, 1], range(1)) == [(0, True), (1, False)]  # a chain, 1 accepted


def test_the_controller_plans_a_tree_prefix_and_learns_from_its_siblings():
    drafter = SuffixDrafter(scope="request")
    # a verification that costs little per token: the whole offer pays
    costs = CostModel(CostCurve({n: 100.0 + 5.0 * n for n in range(1, 17)}), {"suffix": 0.0})
    ctl = Controller([drafter], costs)
    seen = lambda: sum(sum(c[1]) for c in ctl.state()["suffix"]["calibrations"])  # noqa: E731
    ctl.observe("w", "suffix", Draft([1, 2], None, [0.45, 0.45], [-1, -1]), 1, (1,))
    assert seen() == 2  # both children of the context were reached: one rejected, one not
    ctl.observe("w", "suffix", Draft([1, 2], None, [0.45, 0.45]), 0)
    assert seen() == 3  # a chain rejected at its first token: the second was never reached
    assert ctl.state()["suffix"]["calibrations"][0][0][4] == 1  # the first tokens' bin 4
    offer = [0.45, 0.45, 0.45]
    tree_plan = ctl.plan("t", room=8, offers={"suffix": offer}, trees={"suffix": [-1, -1, 0]})
    chain_plan = ctl.plan("c", room=8, offers={"suffix": offer})
    assert tree_plan.drafter is drafter and tree_plan.k_max == 3 and chain_plan.k_max >= 1
    # the same acceptance a per token: a tree of two children and a grandchild expects
    # 2a + a^2 accepted tokens, a chain of m tokens a + ... + a^m
    a = (tree_plan.expected_tokens) ** 0.5 - 1
    assert 0 < a < 1
    m = chain_plan.k_max
    assert chain_plan.expected_tokens == pytest.approx(sum(a**i for i in range(m + 1)))


def test_a_round_that_fails_after_feeding_a_tree_leaves_no_tree_behind():
    """The target fails after it fed the batch's trees: the round is undone (the trees
    dropped from the caches) and retried a request at a time, and greedy output is plain."""
    from test_rounds import PROMPTS as THREE
    from test_rounds import FaultyLM, Injector, run

    target = FaultyLM(vocab=12, seed=1)
    engine = Engine(target, RandomTrees(12, seed=3), k=4)
    target.inject = Injector(at=3, times=2)  # the batch's round, then one request's retry
    params = [SamplingParams(max_tokens=24)] * 3
    got = run(engine, params)
    assert target.inject.calls >= 4
    want = [plain_decode(ToyLM(vocab=12, seed=1), p, params[0]) for p in THREE]
    assert [g for g, _ in got if g is not None] == [
        w for (g, _), w in zip(got, want, strict=True) if g
    ]
    assert sum(g is None for g, _ in got) == 1  # the request whose retry failed too
    assert not target.caches and not target.pending


def test_filler_after_a_tree_is_chained_to_its_last_token():
    from specwise.engine import _fed_tree

    # fed: last emitted token, two siblings, two filler tokens (an aligned batch)
    assert _fed_tree(Draft([4, 5], None, None, [-1, -1]), 5) == [-1, 0, 0, 2, 3]
    assert _fed_tree(Draft([4, 5], None), 3) is None
