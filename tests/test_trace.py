"""The metric definitions, each checked against a worked example on hand-made traces."""

from __future__ import annotations

import io
import itertools
import json

import pytest

from specwise.trace import (
    JsonlSink,
    RequestSummary,
    RoundTrace,
    acceptance_per_position,
    alpha_per_position,
    rejection_histogram,
    summarize,
    tree_figures,
)
from toy import SUMMARY_KEYS


def rt(i, proposed, accepted, emitted, t_ms, draft=1.0, verify=10.0, overhead=1.0):
    bonus = (proposed > 0 and accepted == proposed) or proposed == 0
    return RoundTrace(
        request_id="r",
        round=i,
        drafter="model" if proposed else None,
        proposed=proposed,
        accepted=accepted,
        rejection_position=None if bonus else accepted,
        bonus=bonus,
        emitted=emitted,
        draft_ms=draft,
        verify_ms=verify,
        overhead_ms=overhead,
        batch_size=1,
        t_ms=t_ms,
    )


ROUNDS = [
    rt(0, 4, 2, 3, 100.0),  # rejected at position 2
    rt(1, 4, 4, 5, 112.0),  # all accepted + bonus
    rt(2, 4, 0, 1, 124.0),  # rejected at position 0
    rt(3, 0, 0, 1, 136.0),  # a plain round
]


def test_worked_example():
    s = summarize(ROUNDS, total_ms=140.0, prefill_ms=50.0, peak_rss=1.0)
    assert (s.proposed, s.accepted, s.emitted, s.rounds) == (12, 6, 10, 4)
    assert s.acceptance_rate == 6 / 12
    assert s.mean_accepted_length == 10 / 4
    assert s.alpha_per_position == [2 / 3, 1.0, 0.5, 1.0]
    assert s.acceptance_per_position == [2 / 3, 2 / 3, 1 / 3, 1 / 3]
    assert s.rejection_positions == {"2": 1, "none": 1, "0": 1}
    assert s.goodput_tokens_per_ms == pytest.approx(10 / 48)
    assert (s.draft_ms, s.verify_ms, s.overhead_ms) == (4.0, 40.0, 4.0)
    assert s.ttft_ms == 100.0
    assert s.continuation_tokens_per_s == pytest.approx(9 / 0.036)
    assert (s.total_ms, s.prefill_ms) == (140.0, 50.0)


def test_alpha_is_none_where_never_reached_and_unconditional_is_monotone():
    rounds = [rt(0, 3, 0, 1, 1.0), rt(1, 3, 0, 1, 2.0)]
    assert alpha_per_position(rounds) == [0.0, None, None]
    u = acceptance_per_position(ROUNDS)
    assert all(a >= b for a, b in itertools.pairwise(u))
    assert rejection_histogram([rt(0, 0, 0, 1, 1.0)]) == {}


def test_plain_decoding_figures():
    s = summarize([rt(i, 0, 0, 1, 10.0 * (i + 1)) for i in range(5)], total_ms=50.0, peak_rss=1.0)
    assert s.acceptance_rate is None and s.mean_accepted_length == 1.0
    assert s.alpha_per_position == [] and s.acceptance_per_position == []
    assert s.continuation_tokens_per_s == pytest.approx(4 / 0.040)


def test_empty_request():
    s = summarize([], total_ms=3.0, peak_rss=1.0)
    assert s.emitted == 0 and s.ttft_ms is None and s.goodput_tokens_per_ms is None


def test_summary_has_the_cli_keys():
    assert set(RequestSummary.field_names()) >= SUMMARY_KEYS


def test_jsonl_sink_round_trip(tmp_path):
    path = tmp_path / "sub" / "rounds.jsonl"
    with JsonlSink(path) as sink:
        for r in ROUNDS:
            sink.write(r)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [RoundTrace(**x) for x in lines] == ROUNDS
    buf = io.StringIO()
    JsonlSink(buf).write({"a": 1})
    assert buf.getvalue() == '{"a":1}\n'


def test_tree_figures_count_only_the_rounds_that_drafted_trees():
    chain, plain = rt(0, 4, 2, 3, 10.0), rt(1, 0, 0, 1, 20.0)
    assert tree_figures([chain, plain]) is None
    trees = [
        RoundTrace(**{**rt(2, 7, 3, 4, 30.0).to_dict(), "depth": 4}),
        RoundTrace(**{**rt(3, 5, 0, 1, 40.0).to_dict(), "depth": 2}),
    ]
    got = tree_figures([chain, plain, *trees])
    assert got == {"share": 2 / 3, "tokens": 6.0, "depth": 3.0, "accepted": 1.5}
