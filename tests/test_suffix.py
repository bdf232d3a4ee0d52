"""The suffix drafter: its indexes against brute force, the proposal rule, the memory's budget,
tenants and file, greedy equality with plain decoding, and the bench's isolation of prompts."""

from __future__ import annotations

import time

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.backends.curves import CostCurve
from specwise.controller import Controller
from specwise.costs import CostModel
from specwise.drafters import SuffixDrafter
from specwise.drafters.suffix_index import MAX_MATCH, LiveIndex, Occurrences, SuffixIndex, chain
from specwise.oracle import plain_decode
from toy import ToyLM


def brute_force(docs, context):
    """(longest suffix length, sorted continuations) of `context` over `docs`, naively."""
    best, follow = 0, []
    for m in range(1, min(MAX_MATCH, len(context)) + 1):
        suffix = list(context[-m:])
        hits = [
            d[i + 1]
            for d in docs
            for i in range(m - 1, len(d) - 1)
            if list(d[i - m + 1 : i + 1]) == suffix
        ]
        if hits:
            best, follow = m, sorted(hits)
    return best, follow


def continuations(found):
    return sorted(int(o.text[e + 1]) for o in found for e in o.ends)


@pytest.mark.parametrize("vocab", [2, 3, 5])
def test_memory_finds_the_longest_suffix_and_every_occurrence(vocab):
    rng = np.random.default_rng(vocab)
    for _ in range(150):
        docs = [rng.integers(0, vocab, rng.integers(2, 25)).tolist() for _ in range(4)]
        mem = SuffixIndex()
        for d in docs:  # one at a time: segments are built and merged as in use
            mem.add(d)
        context = rng.integers(0, vocab, rng.integers(1, 18)).tolist()
        m, follow = brute_force(docs, context)
        found = mem.find(context)
        assert (found[0].length if found else 0) == m
        if len(follow) <= 64:
            assert continuations(found) == follow


def test_live_index_finds_the_longest_earlier_suffix():
    rng = np.random.default_rng(7)
    live = LiveIndex()
    text: list[int] = []
    for _ in range(120):
        text += rng.integers(0, 3, rng.integers(1, 4)).tolist()
        m, follow = brute_force([text], text)  # occurrences before the last position
        found = live.find(text)
        assert (found.length if found else 0) == m
        if found is not None and len(follow) <= 64:
            assert continuations([found]) == follow


def test_chain_takes_the_most_frequent_continuation_with_its_share():
    text = np.array([-1, 1, 2, 3, -1, 1, 2, 4, -1, 1, 2, 4, 5, -1], np.int32)
    found = [Occurrences(2, text, np.array([2, 6, 10]))]  # "1 2" ended at 2, 6, 10
    tokens, conf = chain(found, 5)
    assert tokens == [4, 5]  # 4 twice out of 3; then one of the two 4s goes on with 5
    assert conf == pytest.approx([2 / 3 * 2 / 4, 1 / 2 * 3 / 5])
    # a tie goes to the most recent occurrence
    tie = [Occurrences(1, text, np.array([2, 6]))]
    assert chain(tie, 1)[0] == [4]
    assert chain(found, 0) == ([], []) and chain([], 3) == ([], [])


def test_memory_stays_within_its_budget_dropping_least_recently_used():
    mem = SuffixIndex(budget_bytes=64_000)  # 8,000 tokens, in segments of up to 1,024
    docs = [list(range(i * 100, i * 100 + 100)) for i in range(120)]
    for d in docs:
        mem.add(d)
        mem.touch(mem.find(docs[0][:10]))  # document 0 is drafted from again and again
        assert mem.nbytes <= 64_000
    assert mem.find(docs[0][:10])  # kept: recently used
    assert not mem.find(docs[10][:10])  # dropped: least recently used
    assert mem.find(docs[-1][:10])  # the newest is kept


def test_large_merges_run_behind_and_lookups_go_on():
    mem = SuffixIndex()
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 50, 20_000).tolist() for _ in range(16)]  # merges of 2^18+ tokens
    for d in docs:
        mem.add(d)
        assert d[-1] in continuations(mem.find(d[-30:-1]))  # found at once
    for _ in range(200):  # let the background merges finish
        if not mem._busy:
            break
        time.sleep(0.05)
    assert mem.documents == 16 and len(mem._segments) <= 5
    for d in docs:
        assert d[-1] in continuations(mem.find(d[-30:-1]))


def test_memory_file_round_trip_and_errors(tmp_path):
    d = SuffixDrafter(scope="key")
    for tenant, doc in [("a", [1, 2, 3, 4, 5]), ("b", [6, 7, 8, 9])]:
        d.begin(0, doc, tenant)
        d.end(0)
    d.save(tmp_path / "mem.npz")
    again = SuffixDrafter(scope="key")
    again.load(tmp_path / "mem.npz")
    assert sorted(again.memories) == ["a", "b"]
    assert continuations(again.memories["a"].find([2, 3])) == [4]
    assert not again.memories["b"].find([2, 3])
    with pytest.raises(ValueError, match="scope 'key'"):
        SuffixDrafter(scope="global").load(tmp_path / "mem.npz")
    (tmp_path / "junk.npz").write_text("not numpy")
    with pytest.raises(ValueError, match="not a suffix memory file"):
        SuffixDrafter().load(tmp_path / "junk.npz")


@pytest.mark.parametrize(
    "scope, b_sees_a, kept",
    [("key", False, True), ("global", True, True), ("request", False, False)],
)
def test_scopes_keep_tenants_apart(scope, b_sees_a, kept):
    d = SuffixDrafter(scope=scope)
    d.begin(0, [5, 6, 7, 8, 9, 10, 11], "a")
    d.end(0)
    assert bool(d.memories) == kept
    draft_for = {}
    for seq, tenant in [(1, "b"), (2, "a")]:
        d.begin(seq, [1, 2], tenant)
        draft_for[tenant] = d.propose(seq, [1, 2, 6, 7], 3, SamplingParams(), None).tokens
        d.end(seq)
    assert draft_for["a"] == ([8, 9, 10] if kept else [])
    assert draft_for["b"] == ([8, 9, 10] if b_sees_a else [])


def test_tenants_share_one_budget():
    d = SuffixDrafter(scope="key", budget_mib=0.02)  # 20,971 bytes
    for i in range(12):
        for tenant in ("a", "b"):
            d.begin(0, list(range(1000 * i, 1000 * i + 300)), tenant)
            d.end(0)
        assert sum(m.nbytes for m in d.memories.values()) <= 20_971
    assert all(m.documents for m in d.memories.values())  # neither tenant was wiped out


def test_bad_options_are_one_clear_sentence():
    with pytest.raises(ValueError, match="scope 'tenant' is unknown"):
        SuffixDrafter(scope="tenant")
    with pytest.raises(ValueError, match="budget 0 MiB"):
        SuffixDrafter(budget_mib=0)


@pytest.mark.parametrize("k", [2, 4, "auto"])
def test_greedy_equals_plain_across_requests(k):
    """Requests that repeat earlier ones draft from memory; output stays plain decoding's."""
    lm = ToyLM(vocab=6, seed=3, scale=3.0)
    drafter = SuffixDrafter()
    costs = CostModel(CostCurve({n: 10.0 + 2.0 * n for n in range(1, 17)}), {"suffix": 0.01})
    ctl = Controller([drafter], costs) if k == "auto" else None
    eng = Engine(lm, drafter, k=k, controller=ctl)
    params = SamplingParams(max_tokens=40)
    accepted = []
    for prompt in ([1, 2, 3], [4, 1, 2, 3], [1, 2, 3], [2, 2, 1, 2]):
        res = eng.generate(prompt, params)
        assert res.tokens == plain_decode(lm, prompt, params)
        accepted.append(res.summary.acceptance_rate)
    if k != "auto":
        assert accepted[2] == 1.0  # the third request repeats the first: drafted from memory
    assert not lm.caches


def test_bench_never_drafts_from_its_own_prompt():
    from specwise.bench.runner import Options, Runner
    from specwise.prompts import Prompt

    class Tok:
        def render_chat(self, messages):
            return [int(c) for c in messages[-1]["content"]]

        def decode(self, ids):
            return "".join(map(str, ids))

    lm = ToyLM(vocab=10, seed=1, scale=3.0)
    lm.tokenizer = Tok()
    options = Options(
        drafters=["suffix"], ks=[4], repeats=2, max_tokens=30, temperatures=[0.0, 0.7]
    )
    runner = Runner(lm, None, options)
    prompts = [Prompt("p1", "x", ("123",)), Prompt("p2", "x", ("456",))]
    records: list[dict] = []
    runner.run(prompts, lambda rec, rounds: records.append(rec))
    suffix = [r for r in records if r["spec"] == "suffix k=4"]
    memory = runner.engines["suffix k=4"].drafter.memories[""]
    # one per prompt (of the last sampling setting): not the warm-up's, not another repeat's,
    # not the other sampling setting's
    assert memory.documents == 2
    first = [r for r in suffix if r["prompt_id"] == "p1" and r["temperature"] == 0.0]
    assert [r["summary"]["accepted"] for r in first] == [first[0]["summary"]["accepted"]] * 2
