"""Exact tests of the acceptance rules: every random outcome enumerated, no Monte Carlo."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specwise.sampling import SamplingParams, warp
from specwise.verify import (
    Verdict,
    acceptance_probability,
    greedy_match,
    rejection_sample,
    residual,
    sample_and_match,
    tree_greedy_match,
    tree_sample_and_match,
)
from toy import enumerate_outcomes

TOL = 1e-9


def random_dist(rng, v, zeros=0):
    d = rng.random(v) ** 3
    if zeros:
        d[rng.choice(v, zeros, replace=False)] = 0.0
    return d / d.sum()


def one_hot(v, i):
    d = np.zeros(v)
    d[i] = 1.0
    return d


def cases(rng, v):
    """(p, q) pairs: the required kinds, several random draws of each."""
    out = []
    for _ in range(8):
        p = random_dist(rng, v)
        out.append(("random", p, random_dist(rng, v)))
        out.append(("point-mass q", p, None))
        out.append(("one-hot p", one_hot(v, int(rng.integers(v))), random_dist(rng, v)))
        out.append(("p == q", p, p.copy()))
        out.append(("q zeros where p is not", p, random_dist(rng, v, zeros=v // 2)))
        half = v // 2
        pd = np.r_[random_dist(rng, half), np.zeros(v - half)]
        qd = np.r_[np.zeros(half), random_dist(rng, v - half)]
        out.append(("disjoint supports", pd, qd))
    return out


def analytic_emission(p, q):
    """P(first emitted token = y) from the implementation's own pieces: x ~ q, accepted with
    acceptance_probability(p(x), q(x)), else the token is drawn from residual(p, q, x)."""
    total = np.zeros(len(p))
    for x in np.flatnonzero(q > 0):
        a = acceptance_probability(p[x], q[x])
        contrib = (1 - a) * residual(p, q, x)
        contrib[x] += a
        total += q[x] * contrib
    return total


@pytest.mark.parametrize("v", [2, 3, 5, 8])
def test_analytic_emission_equals_p(v):
    rng = np.random.default_rng(v)
    for name, p, q in cases(rng, v):
        if q is None:
            # a point-mass draft: whatever token is proposed, the emitted token is ~ p
            for x in range(v):
                a = acceptance_probability(p[x], 1.0)
                dist = (1 - a) * residual(p, None, x)
                dist[x] += a
                np.testing.assert_allclose(dist, p, atol=TOL, err_msg=f"{name}, x={x}")
        else:
            np.testing.assert_allclose(analytic_emission(p, q), p, atol=TOL, err_msg=name)


def first_token_dist(p, q, rule):
    """Exact distribution of the first emitted token of one k=1 round, by enumeration of the
    draft draw and every random choice inside the rule."""

    def run(s):
        x = s.categorical(q) if q is not None else None
        if rule == "rejection":
            v = rejection_sample([x], q[None, :], np.stack([p, p]), s)
        else:
            v = sample_and_match([x], np.stack([p, p]), s)
        return v.tokens[0]

    dist = enumerate_outcomes(run)
    return np.array([dist.get(i, 0.0) for i in range(len(p))])


@pytest.mark.parametrize("v", [2, 4, 8])
@pytest.mark.parametrize("rule", ["rejection", "sample_and_match"])
def test_rule_first_token_exact(v, rule):
    rng = np.random.default_rng(100 + v)
    for name, p, q in cases(rng, v):
        if q is None:
            for x in range(v):  # point mass: enumerate with the draft fixed to x

                def run(s, x=x, p=p):
                    if rule == "rejection":
                        out = rejection_sample([x], None, np.stack([p, p]), s)
                    else:
                        out = sample_and_match([x], np.stack([p, p]), s)
                    return out.tokens[0]

                dist = enumerate_outcomes(run)
                got = np.array([dist.get(i, 0.0) for i in range(v)])
                np.testing.assert_allclose(got, p, atol=TOL, err_msg=f"{rule} {name} x={x}")
        else:
            np.testing.assert_allclose(
                first_token_dist(p, q, rule), p, atol=TOL, err_msg=f"{rule} {name}"
            )


class Chain:
    """Toy target and draft as exact conditional distributions of the last token."""

    def __init__(self, v, seed, mode):
        rng = np.random.default_rng(seed)
        self.v = v
        self.P = np.stack([random_dist(rng, v) for _ in range(v)])
        if mode == "point":
            self.Q = None
        elif mode == "disjoint":
            self.Q = np.stack([np.roll(r, 1) for r in self.P])
        else:
            self.Q = np.stack([random_dist(rng, v, zeros=1) for _ in range(v)])

    def p(self, prefix):
        return self.P[prefix[-1]]


def spec_decode_exact(chain, k, n_tokens, rule, start=0):
    """Exact joint distribution of the first n_tokens emitted by repeated speculative rounds."""

    def run(s):
        out = [start]
        while len(out) - 1 < n_tokens:
            draft, qs = [], []
            ctx = list(out)
            for _ in range(k):
                if chain.Q is None:
                    x = int(np.argmax(chain.p(ctx)))  # a deterministic point-mass drafter
                else:
                    q = chain.Q[ctx[-1]]
                    x = s.categorical(q)
                    qs.append(q)
                draft.append(x)
                ctx.append(x)
            p_rows = np.stack([chain.p(out + draft[:i]) for i in range(k + 1)])
            if rule == "rejection":
                v = rejection_sample(draft, None if chain.Q is None else np.stack(qs), p_rows, s)
            else:
                v = sample_and_match(draft, p_rows, s)
            out.extend(v.tokens)
        return tuple(out[1 : n_tokens + 1])

    return enumerate_outcomes(run)


def target_joint(chain, n_tokens, start=0):
    dist = {}
    for seq in itertools.product(range(chain.v), repeat=n_tokens):
        prob, prev = 1.0, start
        for t in seq:
            prob *= chain.P[prev][t]
            prev = t
        dist[seq] = prob
    return dist


@pytest.mark.parametrize("mode", ["random", "point", "disjoint"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("rule", ["rejection", "sample_and_match"])
def test_chain_joint_exact(mode, k, rule):
    chain = Chain(v=3, seed=k, mode=mode)
    n = 3 if k < 3 else 2  # the enumeration grows as (draft branches)^(rounds)
    got = spec_decode_exact(chain, k=k, n_tokens=n, rule=rule)
    want = target_joint(chain, n)
    for seq, prob in want.items():
        assert abs(got.get(seq, 0.0) - prob) < TOL, (seq, got.get(seq), prob)
    assert abs(sum(got.values()) - 1.0) < TOL


def test_exact_check_detects_a_broken_rule():
    """Accepting every draft token is not lossless; the same exact comparison must see it."""

    def accept_all(draft, q, p, s):
        return Verdict(len(draft), [*draft, s.categorical(p[len(draft)])], bonus=True)

    chain = Chain(v=3, seed=1, mode="random")

    def run(s):
        q = chain.Q[0]
        x = s.categorical(q)
        v = accept_all([x], q[None, :], np.stack([chain.p([0]), chain.p([0, x])]), s)
        return v.tokens[0]

    dist = enumerate_outcomes(run)
    got = np.array([dist.get(i, 0.0) for i in range(3)])
    assert np.abs(got - chain.P[0]).max() > 1e-3


def test_greedy_match():
    assert greedy_match([1, 2, 3], [1, 2, 3, 4]) == Verdict(3, [1, 2, 3, 4], bonus=True)
    assert greedy_match([1, 5, 3], [1, 2, 3, 4]) == Verdict(1, [1, 2], bonus=False)
    assert greedy_match([], [7]) == Verdict(0, [7], bonus=True)
    assert greedy_match([9], [7, 1]).rejection_position == 0


def test_greedy_params_make_one_hot_p_and_rejection_agrees_with_greedy_match():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 6))
    p = warp(logits, SamplingParams(temperature=0.0))
    target = np.argmax(logits, axis=-1)
    for draft in itertools.product(range(6), repeat=3):

        def run(s, draft=draft):
            return tuple(rejection_sample(list(draft), None, p, s).tokens)

        dist = enumerate_outcomes(run)
        assert list(dist.values()) == [1.0]
        assert list(next(iter(dist))) == greedy_match(list(draft), target).tokens


def test_zero_q_draft_token_is_an_error():
    with pytest.raises(ValueError, match="q = 0"):
        rejection_sample([1], np.array([[1.0, 0.0]]), np.array([[0.5, 0.5]] * 2), None)


# -- tree drafts ----------------------------------------------------------------------------


def random_tree(rng, v, n):
    """A tree of n nodes over a vocabulary of v tokens: parents before children, siblings
    distinct."""
    tokens, parents = [], []
    while len(tokens) < n:
        parent = int(rng.integers(-1, len(tokens)))
        used = {t for t, q in zip(tokens, parents, strict=True) if q == parent}
        free = [t for t in range(v) if t not in used]
        if free:
            tokens.append(int(rng.choice(free)))
            parents.append(parent)
    return tokens, parents


def tree_rows(table, tokens, parents):
    """p after the root and after each node: the target's next-token distribution given the
    path from the root (a fixed random function of the path)."""

    def path(i):
        return () if i < 0 else (*path(parents[i]), tokens[i])

    return np.stack([table(()), *(table(path(i)) for i in range(len(tokens)))])


def plain_tree_distribution(table, tokens, parents):
    """What decoding token by token from the target emits, stopped where the tree stops:
    {emitted sequence: probability}, enumerated."""
    out: dict[tuple, float] = {}

    def walk(node, prefix, prob):
        p = table(prefix)
        kids = {tokens[i]: i for i in range(len(tokens)) if parents[i] == node}
        for y in np.flatnonzero(p > 0):
            seq, pr = (*prefix, int(y)), prob * p[y]
            if int(y) in kids:
                walk(kids[int(y)], seq, pr)
            else:
                out[seq] = out.get(seq, 0.0) + pr

    walk(-1, (), 1.0)
    return out


def prefix_table(rng, v):
    memo: dict[tuple, np.ndarray] = {}

    def table(prefix):
        if prefix not in memo:
            memo[prefix] = random_dist(rng, v, zeros=int(rng.integers(0, 2)))
        return memo[prefix]

    return table


@pytest.mark.parametrize("v, n", [(2, 3), (3, 4), (3, 6), (4, 5)])
def test_tree_sample_and_match_emits_exactly_the_target_distribution(v, n):
    rng = np.random.default_rng(100 * v + n)
    for _ in range(6):
        table = prefix_table(rng, v)
        tokens, parents = random_tree(rng, v, n)
        rows = tree_rows(table, tokens, parents)
        got = enumerate_outcomes(
            lambda s, t=tokens, q=parents, r=rows: tuple(tree_sample_and_match(t, q, r, s).tokens)
        )
        want = plain_tree_distribution(table, tokens, parents)
        assert set(got) <= set(want)
        for seq, prob in want.items():
            assert got.get(seq, 0.0) == pytest.approx(prob, abs=TOL), (tokens, parents, seq)


def test_a_broken_tree_rule_fails_the_distribution_test():
    """Drawing again once when the first draw matches no child (favouring the draft) is the
    kind of bug the test above must catch."""

    def broken(tokens, parents, p, s):
        redrawn = set()

        def pick(row):
            y = s.categorical(p[row])
            node = row - 1
            kids = [tokens[i] for i in range(len(tokens)) if parents[i] == node]
            if kids and y not in kids and row not in redrawn:
                redrawn.add(row)
                y = s.categorical(p[row])
            return y

        from specwise.verify import _tree_walk

        return _tree_walk(tokens, parents, pick)

    rng = np.random.default_rng(5)
    table = prefix_table(rng, 3)
    tokens, parents = [0, 1, 2], [-1, -1, 0]
    rows = tree_rows(table, tokens, parents)
    got = enumerate_outcomes(lambda s: tuple(broken(tokens, parents, rows, s).tokens))
    want = plain_tree_distribution(table, tokens, parents)
    assert max(abs(got.get(k, 0.0) - w) for k, w in want.items()) > 1e-3


def test_tree_greedy_follows_the_argmax_and_reports_the_path():
    tokens, parents = [5, 6, 7, 8], [-1, -1, 1, 2]  # root -> 5 ; root -> 6 -> 7 -> 8
    v = tree_greedy_match(tokens, parents, [6, 0, 7, 1, 3])  # argmax after root, 5, 6, 7, 8
    assert (v.accepted, v.tokens, v.path, v.bonus) == (2, [6, 7, 1], (1, 2), False)
    assert v.rejection_position == 2
    leaf = tree_greedy_match(tokens, parents, [6, 0, 7, 8, 4])
    assert (leaf.accepted, leaf.tokens, leaf.path, leaf.bonus) == (3, [6, 7, 8, 4], (1, 2, 3), True)
    none = tree_greedy_match(tokens, parents, [9, 0, 0, 0, 0])
    assert (none.accepted, none.tokens, none.bonus) == (0, [9], False)
    # a chain is a tree: the same verdict as greedy_match
    chain = tree_greedy_match([1, 2, 3], [-1, 0, 1], [1, 2, 4, 0])
    assert (chain.accepted, chain.tokens) == (
        greedy_match([1, 2, 3], [1, 2, 4, 0]).accepted,
        [1, 2, 4],
    )


def test_malformed_trees_are_refused():
    with pytest.raises(ValueError, match="parent comes before"):
        tree_greedy_match([1, 2], [1, -1], [0, 0, 0])
    with pytest.raises(ValueError, match="repeats its sibling"):
        tree_greedy_match([1, 1], [-1, -1], [0, 0, 0])
