"""`specwise bench replay`: the stand-in target that answers with a recording, the replay of
the engine over it, hindsight's bound, and the command."""

from __future__ import annotations

import numpy as np
import pytest

from specwise.backends.curves import CostCurve
from specwise.bench.replay import (
    Recorded,
    Recording,
    _accepted_path,
    from_bench,
    frozen,
    hindsight,
    plans,
    replay,
    speedups,
)
from specwise.cli import main
from specwise.costs import CostModel
from specwise.drafters.base import Draft, make_drafters
from specwise.sampling import SamplingParams
from toy import ToyLM, ToyTokenizer

NAMES = ["ngram", "suffix"]


def _costs() -> CostModel:
    free = dict.fromkeys(NAMES, 0.0)
    return CostModel(CostCurve({1: 10.0, 2: 11.0, 4: 13.0, 8: 17.0, 16: 25.0}), free, 0.0, free)


def test_the_recorded_target_answers_every_row_with_the_recording():
    lm = Recorded(ToyLM(vocab=12))
    lm.play(Recording("c", "x", [5, 1, 2], [3, 4, 6, 7]))  # truth 5 1 2 3 4 6 7, then the end
    (rows,) = lm.forward([(0, [5, 1])])
    assert rows.argmax(axis=1).tolist() == [1, 2]
    (last,) = lm.forward([(0, [2, 3])], last_only=True)
    assert last.argmax(axis=1).tolist() == [4]  # row of position 3
    # A tree under the last token: rows follow each token's depth, not its index.
    (tree,) = lm.forward([(0, [4, 6, 9, 7])], trees=[[-1, 0, 0, 1]])
    assert tree.argmax(axis=1).tolist() == [6, 7, 7, 0]  # depth 0, 1, 1, 2 (past the end: 0)
    lm.keep(0, [0, 1, 3])  # keep 4 6 7: the cache is as a chain would leave it
    assert lm.length(0) == 7
    (rows,) = lm.forward([(0, [7])])
    assert rows.argmax(axis=1).tolist() == [0]
    lm.truncate(0, 3)
    (rows,) = lm.forward([(0, [3, 4])], rows=[1])
    assert rows.shape[0] == 1 and rows.argmax(axis=1).tolist() == [4]
    lm.release(0)
    assert lm.in_use() == 0


@pytest.mark.parametrize(
    ("tokens", "parents", "truth", "accepted"),
    [
        ([2, 3, 4], None, [2, 3, 7], 2),
        ([2, 3, 4], None, [9], 0),
        ([2, 3, 7, 9], [-1, 0, 1, 1], [2, 3, 9, 1], 3),  # the second child of 3
        ([2, 8, 3, 9], [-1, -1, 0, 2], [8, 3], 1),  # 8's subtree has nothing more
        ([2, 8, 3, 9], [-1, -1, 0, 2], [2, 3, 9], 3),
    ],
)
def test_the_accepted_path_follows_the_answer_through_a_chain_or_a_tree(
    tokens, parents, truth, accepted
):
    assert _accepted_path(Draft(tokens, None, None, parents), truth) == accepted


def test_hindsight_drafts_the_accepted_prefix_whose_round_pays_best():
    # After the first token the context ends in 5 1, which the prompt continues with 2 3 4;
    # the answer goes 2 3 7: two of three accepted. Costs 10, 11, 12 ms for 1, 2, 3 tokens:
    # drafting both (3 tokens for 12 ms) beats one (2 for 11) and plain (1 for 10); then one
    # token is left, plainly. 22 ms against plain's 4 x 10.
    rec = Recording("c", "x", [5, 1, 2, 3, 4, 6, 5], [1, 2, 3, 7, 8])
    (got,) = hindsight(ToyLM(vocab=12), [rec], make_drafters(["ngram"]), _costs())
    assert (got.ms, got.plain_ms, got.rounds, got.drafted, got.accepted) == (22.0, 40.0, 2, 1, 2)
    assert speedups([got]) == {"c": pytest.approx(40 / 22), "all": pytest.approx(40 / 22)}


def test_a_replay_gives_the_recorded_answer_and_prices_each_round_as_the_controller_does():
    rng = np.random.default_rng(0)
    block = [int(t) for t in rng.integers(1, 12, size=24)]
    recs = [
        Recording("copy", "a", [*block, 1], block[:20]),  # the answer copies the prompt
        Recording("copy", "b", [3, 1], block[:16]),  # ... the earlier answer (suffix memory)
        Recording("free", "c", [2, 2], [int(t) for t in rng.integers(1, 12, size=16)]),
    ]
    target = ToyLM(vocab=12)  # takes trees: the suffix drafter offers them
    for names in (["ngram"], NAMES):
        got = replay(target, recs, make_drafters(names), _costs())
        assert [p.category for p in got] == ["copy", "copy", "free"]
        assert all(p.plain_ms == (len(r.output) - 1) * 10.0 for p, r in zip(got, recs, strict=True))
        assert got[0].drafted > 0 and got[0].accepted > 0
        assert got[0].ms < got[0].plain_ms
        bound = hindsight(target, recs, make_drafters(names), _costs())
        assert sum(p.ms for p in bound) <= sum(p.ms for p in got)


def _with_states(target: ToyLM, category: str, pid: str, prompt: list[int], n: int) -> Recording:
    """The target's plain greedy answer to `prompt` with its layer states at every position."""
    from specwise.oracle import plain_decode

    output = plain_decode(target, prompt, SamplingParams(max_tokens=n))
    target.forward([(99, prompt + output)])
    states = target.hiddens(99, 0)
    target.release(99)
    return Recording(category, pid, prompt, output, states)


def test_the_eagle_layer_replayed_over_recorded_states_decides_and_accepts_as_on_the_target(
    tmp_path, monkeypatch
):
    """Over a recording of the target's answers and layer states, `replay` runs the layer's
    rounds exactly as the engine does on the target itself (same plans, drafts, acceptances),
    since the controller's costs are the same frozen ones; and it reports what the plans
    expected against what they got."""
    from specwise.controller import Controller
    from specwise.drafters.eagle import EagleDrafter
    from specwise.engine import Engine
    from test_eagle import LAYERS, _toy_layer

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    target = ToyLM(vocab=12, seed=3, hidden=LAYERS)
    recs = [_with_states(target, "c", f"p{i}", [1, 5, 3, 7, 2, 5, 3, 7, 2, 9, i], 30)
            for i in range(3)]
    layer = _toy_layer(target)
    costs = CostModel(CostCurve({1: 10.0, 2: 10.5, 4: 11.0, 8: 13.0, 16: 17.0}),
                      {"eagle": 0.1}, 0.0, {"eagle": 0.0})
    got = replay(target, recs, [EagleDrafter(layer)], costs, layers=LAYERS)
    engine = Engine(target, [EagleDrafter(layer)], k="auto",
                    controller=Controller([EagleDrafter(layer)], frozen(costs)))
    want = []
    for rec in recs:
        res = engine.generate(rec.prompt, SamplingParams(max_tokens=len(rec.output)))
        assert res.tokens == rec.output
        want.append([(r.drafter, r.proposed, r.accepted) for r in res.rounds[1:]])
    assert sum(p.drafted for p in got) > 0
    assert [p.accepted for p in got] == [sum(a for _, _, a in w) for w in want]
    assert [p.drafted for p in got] == [sum(d is not None for d, _, _ in w) for w in want]
    assert sum(p.planned for p in got) > 0 and sum(p.expected for p in got) > 0
    assert all(p.realised <= p.accepted and p.planned <= p.drafted for p in got)
    lines = plans({"auto[eagle]": got, "hindsight[eagle]": got})
    assert len(lines) == 3 and lines[2].startswith("| auto[eagle] | ")
    bound = hindsight(target, recs, [EagleDrafter(layer)], costs, layers=LAYERS)
    assert sum(p.ms for p in bound) <= sum(p.ms for p in got)
    assert sum(p.accepted for p in bound) > 0


def test_the_bench_answers_become_recordings_with_their_states(tmp_path, monkeypatch):
    import specwise.prompts
    from specwise import teacher
    from specwise.prompts import Prompt
    from test_eagle import LAYERS, _prompts

    asks = [Prompt(f"{c}-1", c, (p,)) for c, p in zip(["chat", "math"], _prompts(2), strict=True)]
    monkeypatch.setattr(specwise.prompts, "shipped", lambda: asks)
    target = ToyLM(vocab=6, seed=2, scale=3.0, hidden=LAYERS)
    target.tokenizer = ToyTokenizer(list("abcdef"))
    target.eos_token_ids = frozenset()
    teacher.bench_answers(target, tmp_path / "bench", max_tokens=8, sequences=2)
    data = teacher.Data(tmp_path / "bench")
    recs = from_bench(data, max_tokens=5)
    assert sorted((r.category, r.id) for r in recs) == [("chat", "chat-1"), ("math", "math-1")]
    for r in recs:
        q = [m["name"] for m in data.meta].index(r.id)
        a = int(data.starts[q])
        n = len(r.prompt) + len(r.output)
        assert len(r.output) == 5 and data.tokens[a : a + n].tolist() == r.prompt + r.output
        assert not data.train[a : a + len(r.prompt) - 1].any() and data.train[a + len(r.prompt) - 1]
        assert np.array_equal(r.states, data.states(a, a + n))
        lm = Recorded(target, LAYERS, r.states.shape[1])
        lm.play(r)
        lm.hold(0, r.prompt)
        assert np.array_equal(lm.hiddens(0, 2), r.states[2 : len(r.prompt)].astype(np.float32))
        assert lm.hiddens(0, len(r.prompt)) is None


def test_a_replay_refuses_an_answer_it_cannot_reproduce(monkeypatch):
    rec = Recording("c", "x", [1, 2, 3, 1, 2], [3, 1, 2, 3])
    lm_next = Recorded._next
    monkeypatch.setattr(Recorded, "_next", lambda self, p: 0 if p == 7 else lm_next(self, p))
    with pytest.raises(ValueError, match="x: the replayed answer differs from the recorded one"):
        replay(ToyLM(vocab=12), [rec], make_drafters(["ngram"]), _costs())


def test_the_command_replays_over_the_smallest_model(smollm2_path, tmp_path, capsys):
    out = tmp_path / "replay"
    args = ["bench", "replay", "--target", str(smollm2_path), "--categories", "code_editing"]
    assert main([*args, "--limit", "1", "--max-tokens", "24", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    header = "| category | auto[ngram] | hindsight[ngram] | auto[ngram+suffix] | hindsight[ngram+suffix] |"
    assert header in printed and "| code_editing |" in printed
    lines = (out / "replay.md").read_text().splitlines()
    assert lines[0].startswith("priced at ms per target call by tokens in it (1: ")
    assert lines[1] == header
    assert len((out / "recordings.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sets", "ngram;model"], "--sets names model, which drafts with a model"),
        (["--sets", " ; "], "--sets ' ; ' names no drafters"),
        (["--max-tokens", "1"], "--max-tokens 1 is invalid"),
        (["--sets", "sufix"], "unknown drafter 'sufix'"),
        (["--offer-ms", "ngram:4"], "--offer-ms 'ngram:4' is invalid; use NAME=MS"),
        (["--offer-ms", "ngram=-1"], "--offer-ms 'ngram=-1' is invalid"),
        (["--offer-ms", "ngram=nan"], "--offer-ms 'ngram=nan' is invalid"),
        (["--offer-ms", "eagle=4"],
         "--offer-ms names eagle, which no set drafts with; use one of ngram"),
    ],
)
def test_the_command_refuses_sets_it_cannot_replay(args, message, capsys):
    assert main(["bench", "replay", *args]) == 2
    assert message in capsys.readouterr().err


def test_every_offer_asked_is_priced_taken_or_not(monkeypatch):
    """An offer is paid for whether the plan takes it or not: at a cost of c ms a token the
    replay's time grows by c times the tokens of every offer asked, beside the target's calls
    (a cost this small changes no decision)."""
    import specwise.bench.replay as replay_module

    asked: list[int] = []

    class Counting(replay_module.Controller):
        def offer_length(self, d, rid, longest, have=None):
            n = super().offer_length(d, rid, longest, have)
            asked.append(n)
            return n

    monkeypatch.setattr(replay_module, "Controller", Counting)
    rng = np.random.default_rng(0)
    block = [int(t) for t in rng.integers(1, 12, size=24)]
    recs = [Recording("copy", "a", [*block, 1], block[:20]),
            Recording("free", "c", [2, 2], [int(t) for t in rng.integers(1, 12, size=16)])]
    target = ToyLM(vocab=12)
    free = replay(target, recs, make_drafters(["ngram"]), _costs())
    asked.clear()
    c = 1e-6
    costs = _costs()
    costs.draft_ms_per_token["ngram"] = c
    paid = replay(target, recs, make_drafters(["ngram"]), costs)
    assert [p.rounds for p in paid] == [p.rounds for p in free] and sum(asked) > 20
    extra = sum(p.ms for p in paid) - sum(p.ms for p in free)
    assert extra == pytest.approx(c * sum(asked), rel=1e-6)
    offers = sum(n > 0 for n in asked)
    asked.clear()
    costs.offer_ms["ngram"] = 2e-6  # and what each offer costs beyond its tokens
    paid = replay(target, recs, make_drafters(["ngram"]), costs)
    extra = sum(p.ms for p in paid) - sum(p.ms for p in free)
    assert extra == pytest.approx(c * sum(asked) + 2e-6 * offers, rel=1e-6)
