"""`specwise bench steps`: a trace's step accounting, on traces with and without step ids."""

from __future__ import annotations

import json

import pytest

from specwise.bench.steps import account, read_steps, table


def rnd(rid, step, verify, overhead, proposed=0, emitted=1, decision="plain", padded=0):
    return {
        "request_id": rid,
        "round": 1,
        "step": step,
        "draft_ms": 0.0,
        "verify_ms": verify,
        "overhead_ms": overhead,
        "proposed": proposed,
        "padded": padded,
        "emitted": emitted,
        "batch_size": 2,
        "decision": decision,
    }


def trace(with_steps: bool) -> list[dict]:
    """Two requests: 3 plain steps of 100 ms, one planned step (a draft of 2, all accepted:
    125 ms, 4 tokens), one aligned step (130 ms, 5 tokens), and a fixed-k request's round."""
    rows = []
    for i, verify in enumerate([95.0, 96.0, 94.0]):
        rows += [rnd("a", i, verify, 5.0), rnd("b", i, verify, 5.0 + 1.5 * with_steps)]
    rows += [rnd("a", 3, 120.0, 5.0, proposed=2, emitted=3), rnd("b", 3, 120.0, 5.0)]
    aligned = "aligned: 2 x 1"
    rows += [
        rnd("a", 4, 125.0, 5.0, proposed=1, emitted=2, decision=aligned),
        rnd("b", 4, 125.0, 5.0, proposed=1, emitted=3, decision=aligned, padded=0),
    ]
    rows.append(rnd("fixed", 5, 50.0, 1.0, decision=None))
    rows.append({**rnd("a", None, 1.0, 1.0), "round": 0})  # round 0: not a step
    if not with_steps:
        for r in rows:
            del r["step"]
    return rows


@pytest.mark.parametrize("with_steps", [True, False], ids=["step ids", "equal timings"])
def test_the_accounting_prices_each_speculative_step_by_plain_steps(with_steps):
    rows = trace(with_steps)
    assert [len(s) for s in read_steps(rows)] == [2, 2, 2, 2, 2, 1]
    (a,) = account(rows)
    assert (a.batch_size, a.steps, a.aligned, a.planned) == (2, 5, 1, 1)
    # plain steps cost 100, 101, 99 ms (the least overhead of the step): median 100 ms for
    # 2 tokens; the planned step emitted 4 in 125 ms, the aligned one 5 in 130 ms
    assert a.planned_saved_ms == pytest.approx(100 * 4 / 2 - 125)
    assert a.aligned_saved_ms == pytest.approx(100 * 5 / 2 - 130)
    assert a.ms == pytest.approx(100 + 101 + 99 + 125 + 130)


def test_the_command_prints_a_table_and_refuses_a_bad_file(tmp_path, capsys):
    from specwise.cli import main

    path = tmp_path / "rounds.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in trace(True)))
    assert table(path)[2] == "| 2 | 5 | 1 | +21.62% | 1 | +13.51% |"  # 120 and 75 of 555 ms
    assert main(["bench", "steps", str(path)]) == 0
    assert "| 2 | 5 | 1 |" in capsys.readouterr().out
    path.write_text("{not json")
    assert main(["bench", "steps", str(path)]) == 2
    assert "is not a JSONL trace" in capsys.readouterr().err
