"""The analysis scripts in scripts/ (BENCHMARKS.md names them): each runs, on a trace written
before rounds carried step ids and on one written after, and says what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_steps import rnd, trace

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(params=[True, False], ids=["step ids", "equal timings"])
def rounds(request, tmp_path) -> Path:
    """test_steps' trace (auto's steps of 2: plain, planned, aligned) and two steps of 2 of
    a fixed k (the `off` setting)."""
    rows = trace(request.param)
    for i, verify in ((6, 90.0), (7, 92.0)):
        rows += [rnd("c", i, verify, 2.0, decision=None), rnd("d", i, verify, 2.0, decision=None)]
    if not request.param:
        for r in rows:
            r.pop("step", None)
    path = tmp_path / "rounds.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_the_trace_scripts_read_either_kind_of_trace(rounds, tmp_path):
    by_mode = run("by_mode.py", str(rounds))
    assert "auto batch 2: 5 steps, 0.6 s, 15 tokens, 37.0 ms a token" in by_mode  # 555 ms
    assert "off batch 2: 3 steps" in by_mode
    assert "auto plain 3 verify med 95.0" in run("by_kind.py", str(rounds), "2")
    assert run("drift.py", str(rounds), "2", "2").splitlines()[0].startswith("0 auto auto 2")
    assert "auto 5 2x5" in run("seqb.py", str(rounds))
    assert "batch 2: auto 5 steps, 0 not planned" in run("planning.py", str(rounds))
    backoff = run("backoff.py", str(rounds), "2")
    assert backoff.startswith("batch 2: 5 steps, 2 speculative;") and "5 planned" in backoff
    assert "no aligned step of 2 after" in run("stale.py", str(rounds), "2")  # each shape once
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"target": {"1": 50.0, "2": 60.0, "3": 70.0}}))
    assert "batch 2, 2 drafted: 1 steps" in run("beside.py", str(rounds), str(costs))


def test_probe_cost_reads_a_bench_runs_rounds(tmp_path):
    def r(rnd_, drafter, emitted, ms):
        return {
            "round": rnd_,
            "config": "auto | T=0",
            "prompt_id": "p1",
            "drafter": drafter,
            "emitted": emitted,
            "draft_ms": 0.0,
            "verify_ms": ms,
            "overhead_ms": 0.0,
        }

    rows = [r(0, None, 1, 50.0), r(1, None, 1, 10.0), r(2, "ngram", 3, 20.0), r(3, None, 1, 10.0)]
    path = tmp_path / "rounds.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    # the speculative round: 3 tokens worth 30 ms of plain rounds, in 20 ms: 10 of 40 ms saved
    assert run("probe_cost.py", str(path)).strip() == "p1 auto | T=0 1 +25.0% saved"


@pytest.mark.slow
def test_the_measuring_scripts_run_on_the_smallest_model(smollm2_path):
    model = str(smollm2_path)
    out = run("interleave.py", "--model", model, "--backend", "llama_cpp", "--blocks", "2")
    assert out.splitlines()[0].startswith("0 off ") and "'auto'" in out.splitlines()[-1]
    out = run("lmhead.py", "--model", model, "--backend", "llama_cpp", "--repeats", "1")
    assert len(out.splitlines()) == 3 and "first only" in out
    out = run("amx_curve.py", "auto", "--model", model, "--sizes", "1,2", "--repeats", "1")
    assert out.split()[0] in ("True", "False") and "1:" in out


@pytest.mark.slow
def test_the_soak_script_serves_loads_and_drains_a_server(smollm2_path, tmp_path, monkeypatch):
    """`make soak` in a few seconds: a server of its own, faults beside the load, answers
    checked against the same requests alone, and a clean exit on SIGTERM."""
    import socket

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path / "home"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run(
        "soak.py",
        *("--seconds", "4", "--clients", "2", "--faults", "1.5", "--max-tokens", "6"),
        *("--sample-every", "1", "--port", str(port), "--out", str(tmp_path / "soak")),
        *("--", "--target", str(smollm2_path), "--backend", "llama_cpp", "--max-batch", "2"),
    )
    assert "PASS  greedy answers as alone, or parted at near-ties" in out
    assert "PASS  it drained and exited with 0 on SIGTERM (0)" in out
    assert out.strip().splitlines()[-1] == "make soak: passed"
    result = json.loads((tmp_path / "soak" / "soak.json").read_text())
    assert result["faults"] and result["alone"]["answers"] > 0
