"""`bench load`'s arithmetic on made-up request timelines: steady throughput counts only the
time in which every worker had a request in flight; the SLO and where it breaks; the open
loop's arrival times; a soak's checks and its answers against the same requests alone."""

from __future__ import annotations

import math

import pytest

from specwise.bench import load
from specwise.bench.load import Level, LoadOptions, Setting, Slo, _progress
from specwise.bench.load_stats import _steady, _tokens_by, slo_breaks
from specwise.bench.soak import soak_checks, soak_verdict
from specwise.bench.ties import alone_check, near_ties


def request(sent: float, progress: list[tuple[float, float]]) -> dict:
    return {"sent": sent, "first": progress[0][0], "end": progress[-1][0], "progress": progress}


def test_tokens_by_is_the_last_count_at_or_before_a_time():
    p = [(1.0, 2.0), (2.0, 5.0), (4.0, 6.0)]
    assert [_tokens_by(p, t) for t in (0.5, 1.0, 1.5, 2.0, 3.9, 4.0, 9.0)] == [
        0.0,
        2.0,
        2.0,
        5.0,
        5.0,
        6.0,
        6.0,
    ]


def test_progress_takes_the_servers_counts_or_scales_chunks():
    assert _progress([(1.0, 3), (2.0, 7)], 8, 2.5) == [(1.0, 3.0), (2.0, 7.0), (2.5, 8.0)]
    # a server without per-chunk usage: 4 chunks for 8 tokens
    assert _progress([(1.0, None), (2.0, None), (3.0, None), (4.0, None)], 8, 4.5) == [
        (1.0, 2.0),
        (2.0, 4.0),
        (3.0, 6.0),
        (4.0, 8.0),
        (4.5, 8.0),
    ]


def test_steady_counts_tokens_while_every_worker_is_busy_after_the_start_up():
    # 2 workers, 3 requests: A and B sent at 0 (first tokens at 1 and 2), A ends at 4 and C is
    # sent; B ends at 6, C at 9. Steady: from 2 (both have a token) to 6 (B ends, the first
    # to end after the last send); the start-up before 2 and the tail after 6 are not counted.
    a = request(0.0, [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0)])
    b = request(0.0, [(2.0, 2.0), (3.0, 6.0), (6.0, 8.0)])
    c = request(4.0, [(5.0, 1.0), (9.0, 5.0)])
    tokens, seconds = _steady([a, b, c], 2)
    assert seconds == 4.0
    assert tokens == (4.0 - 2.0) + (8.0 - 2.0) + 1.0
    # as many requests as workers: from the last first token to the first end
    assert _steady([a, b], 2) == (2.0 + 4.0, 2.0)


@pytest.mark.parametrize(
    "results",
    [
        [request(0.0, [(1.0, 1.0)])],  # fewer requests than workers
        [request(0.0, [(1.0, 1.0)]), request(0.0, [(2.0, 1.0)]), {"error": "HTTP 500"}],
        [request(0.0, [(1.0, 1.0)]), request(0.0, [(2.0, 1.0)]), {"sent": 1.0, "progress": None}],
        # the start-up outlasts the steady time: a request ends before the other's first token
        [request(0.0, [(1.0, 1.0)]), request(0.0, [(5.0, 1.0)]), request(1.0, [(6.0, 1.0)])],
    ],
)
def test_steady_is_none_without_a_busy_time_or_with_failures_or_no_stream(results):
    assert _steady(results, 2) is None


def test_servers_are_named_by_the_user_or_by_host_and_port():
    from specwise.cli.bench_servers import _servers

    assert _servers("http://127.0.0.1:8000") == {"": "http://127.0.0.1:8000"}
    assert _servers("ik=http://h:1, mainline=http://h:2/v1") == {
        "ik": "http://h:1",
        "mainline": "http://h:2/v1",
    }
    assert _servers("http://h:1,http://h:2") == {"h:1": "http://h:1", "h:2": "http://h:2"}


def test_a_request_meets_the_slo_only_with_its_first_token_and_pace_in_time():
    slo = Slo(ttft_s=2.0, tpot_s=0.2)
    assert slo.met({"ttft_s": 1.9, "tpot_s": 0.2})
    assert slo.met({"ttft_s": 0.5, "tpot_s": None})  # one token: no pace to meet
    assert not slo.met({"ttft_s": 2.1, "tpot_s": 0.1})
    assert not slo.met({"ttft_s": 0.5, "tpot_s": 0.21})
    assert not slo.met({"ttft_s": None, "tpot_s": None})  # not streamed: no TTFT
    assert not slo.met({"error": "HTTP 429", "latency_s": 0.1})


def test_the_slo_breaks_at_the_first_rate_that_misses_its_target():
    def lv(setting, rate, met):
        return {"setting": setting, "rate": rate, "slo_met": met}

    levels = [
        lv("k=auto", 0.1, 1.0),
        lv("k=0", 0.1, 1.0),
        lv("k=auto", 0.4, 0.95),
        lv("k=0", 0.4, 0.5),
        lv("k=auto", 0.2, 0.9),  # the order run does not matter; a share at the target holds
        lv("k=0", 0.2, 0.8),
        lv("k=auto", 0.8, 1.0),  # held again after a miss: the SLO broke below
    ]
    assert slo_breaks(levels, Slo(target=0.9)) == [
        {"setting": "k=auto", "holds_up_to": 0.8, "breaks_at": None},
        {"setting": "k=0", "holds_up_to": 0.1, "breaks_at": 0.2},
    ]
    assert slo_breaks([lv("x", 1.0, 0.0)], Slo())[0] == {
        "setting": "x",
        "holds_up_to": None,
        "breaks_at": 1.0,
    }


def test_an_open_loop_sends_at_poisson_arrival_times_the_same_for_every_setting(monkeypatch):
    """Requests go at their arrival times whatever earlier ones do (here each takes 0.2 s,
    longer than the gaps); a round's arrivals are the same for every setting, and differ
    between rounds."""
    sent: list[float] = []

    def one_request(client, opts, prompt, k):
        sent.append(load.time.perf_counter())
        load.time.sleep(0.2)
        return {"sent": sent[-1], "first": None, "end": sent[-1] + 0.2, "latency_s": 0.2}

    monkeypatch.setattr(load, "one_request", one_request)
    opts = LoadOptions({"": "http://127.0.0.1:9"}, [1], ["a", "b"], [0], None, requests=6)
    level = Level(rate=20.0)
    runs = {}
    for name, k, round_ in (("a", 0, 0), ("b", "auto", 0), ("c", 0, 1)):
        sent.clear()
        results, wall = load._run(opts, level, Setting("http://127.0.0.1:9", k), 0, round_)
        runs[name] = [r["arrival"] for r in results]
        gaps = [s - sent[0] for s in sorted(sent)]
        assert gaps == pytest.approx([a - runs[name][0] for a in runs[name]], abs=0.03)
        assert wall >= runs[name][-1] + 0.2
    assert runs["a"] == runs["b"] != runs["c"]
    assert runs["a"] == sorted(runs["a"]) and runs["a"][0] > 0
    assert runs["a"][-1] < 1.5  # 6 gaps of mean 0.05 s: fewer in flight would have taken 1.2 s


def entries(*tokens_and_gaps):
    """Log-probability entries of an answer: (token, its position's top-2 gap)."""
    return [
        {"token": t, "logprob": -0.1, "top_logprobs": [{"logprob": -0.1}, {"logprob": -0.1 - g}]}
        for t, g in tokens_and_gaps
    ]


def test_an_answer_parts_from_its_answer_alone_at_a_gap_judged_by_the_noise_seen():
    alone = entries(("a", 3.0), ("b", 0.05), ("c", 2.0))
    assert alone_check(alone, entries(("a", 3.0), ("b", 0.05), ("c", 2.0))) == {
        "match": True,
        "noise": 0.0,
    }
    parted = alone_check(alone, entries(("a", 2.9), ("x", 0.05), ("c", 2.0)))
    assert parted == {
        "match": False,
        "position": 1,
        "top2_gap": pytest.approx(0.05),
        "noise": pytest.approx(0.1),
    }
    late = alone_check(alone, entries(("a", 3.0), ("b", 0.05), ("c", 2.0), ("d", 1.0)))
    assert late["match"] is False and late["position"] == 3 and math.isnan(late["top2_gap"])
    summary = near_ties([{"match": True, "noise": 0.0}, parted, late], factor=2.0)
    assert summary == {
        "factor": 2.0,
        "answers": 3,
        "matched": 1,
        "diverged": 2,
        "at_near_ties": 1,  # 0.05 <= 2 x 0.1; the longer answer is not a near-tie
        "noise": pytest.approx(0.1),
        "gaps": [pytest.approx(0.05), late["top2_gap"]],
    }


def test_a_soak_passes_only_when_every_check_does():
    def health(t, rss, **load):
        return {"seconds": t, "health": {"rss_mb": rss, "running": 0, "sequences": 0, **load}}

    result = {
        "seconds": 100.0,
        "samples": [health(0, 50), health(25, 100), health(50, 102), health(100, 104)],
        "errors": {"HTTP 429": 2},
        "faults": [{"fault": "burst", "status": 429, "ok": True, "detail": ""}],
        "alone": None,
    }
    checks = {c["check"]: c for c in soak_checks(result)}
    assert all(c["ok"] for c in checks.values()), checks
    assert checks["resident memory grows < 5% after the first quarter"]["measured"] == "+4.0%"
    assert "greedy answers as alone, or parted at near-ties" not in checks  # not asked
    result["samples"][-1] = health(100, 106, sequences=1)
    result["errors"]["HTTP 500"] = 1
    result["errors"]["ReadTimeout"] = 2  # requests of the load never answered
    result["faults"].append({"fault": "slow_client", "status": None, "ok": False, "detail": "hung"})
    failed = {c["check"] for c in soak_checks(result) if not c["ok"]}
    assert failed == {
        "no 5xx",
        "every request of the load answered (429s aside: the queue was full)",
        "every fault taken as required",
        "nothing left running or holding cache",
        "resident memory grows < 5% after the first quarter",
    }
    assert soak_verdict(result | {"checks": soak_checks(result)})[-1] == "soak: FAILED"


def test_a_soaks_faults_wait_as_long_as_its_load_takes(monkeypatch, tmp_path):
    """A fault that must be answered queues behind the soak's requests: its patience is
    PATIENCE_FACTOR x the longest recent latency of the load (never below faults.REQUEST_S),
    and none comes before as many answers as workers (the first answer here never queued: a
    patience scaled from it alone would be REQUEST_S, too short for the 20-s answers after)."""
    import io
    import itertools

    from specwise.bench import faults
    from specwise.bench import soak as load  # the soak's own `one_request`, `time` and constants

    calls = itertools.count()

    def one_request(client, opts, prompt, k):
        first = next(calls) == 0
        load.time.sleep(0.1 if first else 0.6)
        return {"latency_s": 2.0 if first else 20.0, "tokens": 1}

    patience: list[float] = []

    def run_faults(url, api_key, names, rng, patience_s):
        patience.append(patience_s)
        return [{"fault": names[0], "status": 200, "ok": True, "detail": "", "seconds": 0.0}]

    monkeypatch.setattr(load, "one_request", one_request)
    monkeypatch.setattr(faults, "run_faults", run_faults)
    opts = LoadOptions({"": "http://127.0.0.1:9"}, [2], ["p"], [None], tmp_path)
    result = load.run_soak(opts, seconds=1.2, every=0.6, stream=io.StringIO(), fault_every=0.1)
    assert patience and all(p == pytest.approx(load.PATIENCE_FACTOR * 20.0) for p in patience)
    assert result["faults"][0]["at_s"] >= 0.6
    assert [f["patience_s"] for f in result["faults"]] == patience
