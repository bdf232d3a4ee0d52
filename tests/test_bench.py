"""The workbench: the JSONL loader's errors, the report's arithmetic on hand-made records, and a
tiny end-to-end run of `specwise bench` on the smallest real model."""

from __future__ import annotations

import json

import pytest

from specwise.bench.report import against_hindsight, build
from specwise.bench.runner import Options, Runner
from specwise.bench.session import pick
from specwise.bench.workloads import builtin, interleaved
from specwise.cli import main
from specwise.prompts import CATEGORIES, WorkloadError, load_jsonl
from toy import ToyLM


def write(tmp_path, lines):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt": "x"}', "'category' must be a non-empty string"),
        ('{"category": "chat"}', "exactly one of 'prompt'"),
        ('{"category": "chat", "prompt": "x", "turns": ["y"]}', "exactly one of 'prompt'"),
        ('{"category": "chat", "prompt": ""}', "'prompt' must be a non-empty string"),
        ('{"category": "chat", "turns": []}', "'turns' must be a non-empty list"),
        ('{"category": "chat", "turns": ["a", 3]}', "'turns' must be a non-empty list"),
        ('{"category": "chat", "prompt": "x", "id": [7]}', "'id' must be a string or a number"),
        ('{"category": "c", "prompt": "x", "id": "7", "question_id": 8}', "'7' and 'question_id'"),
    ],
)
def test_loader_names_file_line_and_problem(tmp_path, line, message):
    path = write(tmp_path, ['{"category": "chat", "prompt": "fine"}', line])
    with pytest.raises(WorkloadError) as exc:
        load_jsonl(path)
    assert str(exc.value).startswith(f"{path}:2: ") and message in str(exc.value)


def test_loader_reads_prompts_and_turns_and_rejects_duplicates(tmp_path):
    path = write(
        tmp_path,
        [
            '{"category": "chat", "id": "a", "prompt": "hello"}',
            "",
            '{"category": "mine", "turns": ["one", "two"]}',
            '{"category": "c", "id": 7, "prompt": "an integer id"}',
            '{"question_id": 81, "category": "writing", "turns": ["Spec-Bench / MT-Bench"]}',
            '{"category": "c", "id": 8, "question_id": 8, "prompt": "both, alike"}',
            '{"category": "c", "id": null, "prompt": "no id"}',
        ],
    )
    got = load_jsonl(path)
    assert [(p.id, p.category, p.turns) for p in got] == [
        ("a", "chat", ("hello",)),
        ("mine-3", "mine", ("one", "two")),
        ("7", "c", ("an integer id",)),
        ("81", "writing", ("Spec-Bench / MT-Bench",)),
        ("8", "c", ("both, alike",)),
        ("c-7", "c", ("no id",)),
    ]
    dup = write(
        tmp_path,
        [
            '{"category": "c", "id": "x", "prompt": "a"}',
            '{"category": "c", "id": "x", "prompt": "b"}',
        ],
    )
    with pytest.raises(WorkloadError, match=":2: duplicate id 'x'"):
        load_jsonl(dup)
    with pytest.raises(WorkloadError, match="cannot read prompts"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_shipped_workloads():
    prompts = builtin()
    assert len(CATEGORIES) >= 7
    for cat in CATEGORIES:
        assert sum(p.category == cat for p in prompts) >= 8
    assert len({p.id for p in prompts}) == len(prompts)
    assert [p.category for p in pick(prompts, 1)] == list(CATEGORIES)
    mixed = interleaved(prompts)
    assert sorted(p.id for p in mixed) == sorted(p.id for p in prompts)
    assert [p.category for p in mixed[: len(CATEGORIES)]] == list(CATEGORIES)
    assert [p.id for p in mixed if p.category == "math"] == [
        p.id for p in prompts if p.category == "math"
    ]
    with pytest.raises(WorkloadError, match="unknown categories nope"):
        builtin(["nope"])


def record(
    spec, pid, emitted, total_ms, prefill_ms, match=True, proposed=0, accepted=0, rounds=None
):
    rounds = rounds if rounds is not None else emitted
    return {
        "config": f"{spec} | T=0",
        "spec": spec,
        "sampling": "T=0",
        "category": "code",
        "prompt_id": pid,
        "repeat": 0,
        "summary": {
            "emitted": emitted,
            "total_ms": total_ms,
            "prefill_ms": prefill_ms,
            "draft_prefill_ms": 0.0,
            "ttft_ms": prefill_ms + 10,
            "proposed": proposed,
            "accepted": accepted,
            "rounds": rounds,
            "draft_ms": 0.0,
            "verify_ms": total_ms - prefill_ms,
            "overhead_ms": 0.0,
            "continuation_tokens_per_s": 1.0,
            "peak_rss_mb": 100.0,
        },
        "check": {"match": True}
        if match
        else {"match": False, "position": 3, "top2_gap": 0.01, "near_tie": True},
    }


ROUND = {  # a round record as the bench writes it: a RoundTrace's fields and its config
    "request_id": "r",
    "round": 1,
    "drafter": "ngram",
    "proposed": 4,
    "accepted": 2,
    "rejection_position": 2,
    "bonus": False,
    "emitted": 3,
    "draft_ms": 1.0,
    "verify_ms": 10.0,
    "overhead_ms": 1.0,
    "batch_size": 1,
    "t_ms": 12.0,
    "category": "code",
    "config": "ngram k=4 | T=0",
}


def test_report_arithmetic_on_hand_made_records():
    # Two prompts. Plain: 100 tokens in 1000 ms of decoding each (prefill 500 / 300 ms).
    # ngram: prompt a 100 tokens in 500 ms (2x), prompt b 100 in 1000 ms (1x).
    recs = [
        record("plain", "a", 100, 1500, 500),
        record("plain", "b", 100, 1300, 300),
        record("ngram k=4", "a", 100, 1000, 500, proposed=80, accepted=60, rounds=40),
        record("ngram k=4", "b", 100, 1300, 300, match=False, proposed=20, accepted=5, rounds=95),
    ]
    rep = build(recs, [], {"command": "test"})
    f = rep.figures["code"]["T=0"]["ngram k=4"]
    assert f["speedup_total"] == pytest.approx((200 / 1500) / (200 / 2000))  # decode time
    assert f["speedup_e2e"] == pytest.approx((200 / 2300) / (200 / 2800))  # total time
    assert f["speedup_median"] == pytest.approx(1.5)  # median of 2.0 and 1.0
    assert f["acceptance_rate"] == pytest.approx(65 / 100)
    assert f["mean_accepted_length"] == pytest.approx(200 / 135)
    assert f["greedy_match_rate"] == 0.5 and f["equivalence_ok"] is True
    assert f["prefill_ms"] == 400.0
    plain = rep.figures["code"]["T=0"]["plain"]
    assert plain["speedup_total"] == 1.0 and plain["greedy_match_rate"] == 1.0
    rec = rep.recommendation["code"]["T=0"]
    assert rec["best_speculative"] == "ngram k=4"
    lo, hi = rec["ci95"]
    assert 1.0 <= lo <= hi <= 2.0
    assert "all" in rep.figures and "speculate" in rec["text"]
    assert "ngram k=4" in rep.table() and "| ngram k=4 |" in rep.markdown()
    assert f["trees"] is None and "Tree drafts" not in rep.markdown()
    assert "| a | 2.00x (0.75) |" in rep.markdown()  # by prompt: 500 ms against 1000, 60 of 80
    assert "| b | 1.00x (0.25) |" in rep.markdown()
    tree = {**ROUND, "proposed": 6, "accepted": 2, "depth": 3}
    f = build(recs, [tree], {"command": "test"}).figures["code"]["T=0"]["ngram k=4"]
    assert f["trees"] == {"share": 1.0, "tokens": 6.0, "depth": 3.0, "accepted": 2.0}
    text = build(recs, [tree], {"command": "test"}).markdown()
    assert "- ngram k=4: trees in 100% of the rounds that drafted, 6.0 tokens 3.0 deep" in text
    assert f["offers"] is None and "Offers asked" not in text  # k fixed: no offers


def test_the_report_counts_the_offers_asked_and_those_drafted_from():
    """Every offer a round asked for is counted against its drafter, drafted from or not, with
    the median time an offer took where the rounds recorded it."""
    recs = [record("plain", "a", 100, 1500, 500), record("auto", "a", 100, 1000, 500)]
    rounds = [
        {**ROUND, "drafter": "eagle", "proposed": 3, "offers": {"eagle": 4, "ngram": 16},
         "offer_ms": {"eagle": 5.0, "ngram": 0.2}},
        {**ROUND, "drafter": None, "proposed": 0, "accepted": 0, "offers": {"eagle": 2, "ngram": 16},
         "offer_ms": {"eagle": 4.0, "ngram": 0.4}},
        {**ROUND, "drafter": "ngram", "proposed": 5, "offers": {"ngram": 16}},
    ]
    rounds = [{**r, "config": "auto | T=0"} for r in rounds]
    rep = build(recs, rounds, {"command": "test"})
    f = rep.figures["code"]["T=0"]["auto"]
    assert f["offers"] == {
        "eagle": {"rounds": 2, "taken": 0.5, "asked": 3.0, "drafted": 1.5, "ms": 4.5},
        "ngram": {"rounds": 3, "taken": 1 / 3, "asked": 16.0, "drafted": 5 / 3,
                  "ms": pytest.approx(0.3)},
    }
    assert ("- auto: eagle asked in 2 rounds, 3.0 tokens a round, 4.50 ms an offer (median); "
            "drafted from in 50% of them, 1.5 tokens a round") in rep.markdown()


def test_the_report_gives_the_target_calls_median_cost_by_tokens_fed():
    """The rounds of one sequence give the cost curve the engine met: the median ms of a call
    by the tokens it fed (a draft and the token before it), against a one-token call; rounds
    of a batch are left out, and a configuration that only fed one token gets no line; the
    curve `auto` was calibrated with follows, as JSON keeps it (sizes as strings)."""
    recs = [record("plain", "a", 100, 1500, 500), record("auto", "a", 100, 1000, 500)]
    rounds = [
        {**ROUND, "proposed": 0, "accepted": 0, "verify_ms": 20.0},
        {**ROUND, "proposed": 0, "accepted": 0, "verify_ms": 24.0},
        {**ROUND, "proposed": 1, "verify_ms": 33.0},
        {**ROUND, "proposed": 1, "verify_ms": 30.0},
        {**ROUND, "proposed": 1, "verify_ms": 99.0, "batch_size": 2},
        {**ROUND, "proposed": 3, "verify_ms": 50.0},
    ]
    rounds = [{**r, "config": "auto | T=0"} for r in rounds] + [
        {**ROUND, "proposed": 0, "accepted": 0, "verify_ms": 21.0, "config": "plain | T=0"}
    ]
    rep = build(recs, rounds, {"command": "test", "calibrated_ms": {"1": 25.0, "2": 32.5}})
    f = rep.figures["code"]["T=0"]
    assert f["auto"]["verify"] == {1: 22.0, 2: 31.5, 4: 50.0}
    assert f["plain"]["verify"] == {1: 21.0}
    text = rep.markdown()
    assert "- auto: 1 22.0, 2 31.5 (1.43x), 4 50.0 (2.27x)" in text
    assert "- calibrated alone, as `auto` started: 1 25.0, 2 32.5 (1.30x)" in text
    assert "- plain: " not in text
    assert text.count("Target calls of one sequence") == 1  # in the section of all categories


def test_a_baseline_on_another_backend_is_timed_compared_and_never_recommended():
    # plain on llama_cpp: 100 tokens in 1500 ms of decoding (plain here: 1000 ms); ngram 500 ms
    recs = [
        record("plain", "a", 100, 1500, 500),
        {**record("plain on llama_cpp", "a", 100, 2000, 500), "check": {}},
        record("ngram k=4", "a", 100, 1000, 500, proposed=80, accepted=60, rounds=40),
    ]
    rep = build(recs, [], {"command": "test"})
    figs = rep.figures["code"]["T=0"]
    assert figs["plain on llama_cpp"]["speedup_total"] == pytest.approx(1000 / 1500)
    assert figs["ngram k=4"]["speedup_vs_baseline"] == pytest.approx(3.0)
    assert figs["plain"]["speedup_vs_baseline"] == pytest.approx(1.5)
    assert "equivalence_ok" not in figs["plain on llama_cpp"]  # two libraries: not judged
    assert rep.recommendation["code"]["T=0"]["best_speculative"] == "ngram k=4"
    assert "over plain on llama_cpp: plain 1.50x, ngram k=4 3.00x" in rep.markdown()
    row = next(line for line in rep.table().splitlines() if line.startswith("code "))
    assert "×plain on llama_cpp" in rep.table()
    assert " ".join(row.split()[3:7]) == "2.00x (1 prompt) 3.00x"  # over plain, over mainline
    assert rep.hindsight == {}  # no auto ran; the baseline is no fixed configuration
    # one prompt: a ratio but no interval, and the recommendation says so
    assert "not enough prompts to decide" in rep.recommendation["code"]["T=0"]["text"]


def test_a_baseline_engine_runs_beside_the_configurations():
    opts = Options(drafters=["ngram"], ks=[2])
    runner = Runner(ToyLM(vocab=12, seed=0), None, opts, baseline=ToyLM(vocab=12, seed=0))
    assert list(runner.engines) == ["plain", "plain on toy", "ngram k=2"]
    assert [c.spec for c in runner.configs("chat")] == ["plain", "plain on toy", "ngram k=2"]


def test_auto_against_hindsight():
    def fig(x):
        return {"speedup_total": x}

    figures = {
        "code": {
            "T=0": {
                "plain": fig(1.0),
                "ngram k=4": fig(1.3),
                "model k=2": fig(0.8),
                "auto": fig(1.25),
            }
        },
        "chat": {
            "T=0": {"plain": fig(1.0), "ngram k=4": fig(0.9), "auto": fig(0.98)},
            "T=0.7": {"plain": fig(1.0), "ngram k=4": fig(1.1)},
        },  # no auto: no row
    }
    h = against_hindsight(figures)
    assert h["code"]["T=0"] == {
        "auto": 1.25,
        "best_fixed": "ngram k=4",
        "best_fixed_speedup": 1.3,
        "ratio": pytest.approx(1.25 / 1.3),
        "faster_than_auto": ["ngram k=4"],
    }
    # Every fixed configuration loses to plain: the bar is plain's 1.0.
    assert h["chat"]["T=0"]["best_fixed"] == "plain"
    assert h["chat"]["T=0"]["ratio"] == pytest.approx(0.98)
    assert h["chat"]["T=0"]["faster_than_auto"] == []
    assert "T=0.7" not in h["chat"]


def test_bench_end_to_end_on_the_smallest_model(smollm2_path, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "bench",
            "--target",
            str(smollm2_path),
            "--draft",
            str(smollm2_path),
            "--categories",
            "code_editing,chat",
            "--limit",
            "1",
            "--max-tokens",
            "12",
            "--k",
            "2,auto",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert set(summary["figures"]) == {"code_editing", "chat", "all"}
    editing = summary["figures"]["code_editing"]["T=0"]
    assert set(editing) == {"plain", "model k=2", "ngram k=2", "auto"}
    assert all(f["equivalence_ok"] for f in editing.values())
    for name in (
        "rounds.jsonl",
        "requests.jsonl",
        "summary.json",
        "report.md",
        "speedup_vs_k.png",
        "acceptance_by_position.png",
        "time_split.png",
        "goodput_vs_temperature.png",
    ):
        assert (out / name).stat().st_size > 0
    assert "Recommendation" in (out / "report.md").read_text()
    assert "k=auto against hindsight" in (out / "report.md").read_text()
    # For people: a table per sampling, exactness in words, a verdict, the report's path.
    printed = stdout.strip().splitlines()[:-1]
    assert printed[0].startswith("T=0 · tokens/s of decoding") and printed[1].startswith("category")
    assert printed[2].split()[0] == "code_editing"  # its own sampling: T=0 (chat's is 0.7)
    assert any(line.startswith("T=0.7 top_p=0.9 · ") for line in printed)
    assert printed[-2].startswith("verdict: auto ") and printed[-1].startswith("report: ")
    assert "exactness: auto's greedy text identical to plain's on " in stdout
    assert "---" not in stdout and "equiv " not in stdout
    # `bench report` prints the same from the run's folder.
    assert main(["bench", "report", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines() == printed

    # The report can be rebuilt from the JSONL files alone, also from a run cut short.
    (out / "report.md").unlink()
    (out / "summary.json").unlink()
    with (out / "requests.jsonl").open("a") as f:
        f.write('{"cut sh')
    assert main(["bench", "report", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("report: ")  # no JSON
    assert main(["bench", "report", str(out), "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rebuilt["figures"]["code_editing"]["T=0"] == editing
    assert "Recommendation" in (out / "report.md").read_text()


def test_fixed_drafters_limit_the_fixed_configurations_not_auto():
    opts = Options(drafters=["model", "ngram"], ks=[2, 3, "auto"], fixed_drafters=["ngram"])
    runner = Runner(ToyLM(vocab=12, seed=0), ToyLM(vocab=12, seed=1), opts)
    assert list(runner.engines) == ["plain", "ngram k=2", "ngram k=3", "auto"]
    assert [d.name for d in runner.engines["auto"].drafters] == ["model", "ngram"]


def test_the_runner_builds_drafters_with_the_options_given():
    opts = Options(
        drafters=["suffix", "ngram"],
        ks=[4, "auto"],
        drafter_options={"suffix": {"scope": "request", "branches": 1, "budget_mib": 2.0}},
    )
    runner = Runner(ToyLM(vocab=12, seed=0), None, opts)
    suffixes = [d for e in runner.engines.values() for d in e.drafters if d.name == "suffix"]
    assert len(suffixes) == 2  # suffix k=4 and auto
    assert all((d.scope, d.branches, d.budget) == ("request", 1, 2 << 20) for d in suffixes)


def test_drafter_options_are_checked_before_any_model_loads(capsys, monkeypatch):
    import specwise.cli.bench
    import specwise.cli.common

    def no_models(*_, **__):
        raise AssertionError("models loaded before the options were checked")

    # where each command looks it up: bench in its own module, generate in `_build_engine`'s
    monkeypatch.setattr(specwise.cli.bench, "_load_models", no_models)
    monkeypatch.setattr(specwise.cli.common, "_load_models", no_models)
    for command in (["bench"], ["generate", "--k", "auto", "hello"]):
        assert main([*command, "--drafter", "ngram,suffix", "--suffix-branches", "0"]) == 2
        assert "suffix branches = 0 is invalid" in capsys.readouterr().err
        assert main([*command, "--drafter", "ngram,suffix", "--suffix-budget", "-1"]) == 2
        assert "suffix budget -1.0 MiB is invalid" in capsys.readouterr().err
    assert main(["bench", "--drafter", "ngram,sufix"]) == 2
    assert "unknown drafter 'sufix'" in capsys.readouterr().err
    assert main(["bench", "--drafter", "suffix", "--suffix-cache", "memory.npz"]) == 2
    assert "--suffix-cache is for generate and serve" in capsys.readouterr().err


def test_bench_errors(capsys, tmp_path):
    assert main(["bench", "--drafter", "ngram", "--fixed-drafter", "model"]) == 2
    assert "--fixed-drafter model names drafters not in --drafter ngram" in (
        capsys.readouterr().err
    )
    assert main(["bench", "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read prompts" in capsys.readouterr().err
    assert main(["bench", "--categories", "nope"]) == 2
    assert "unknown categories" in capsys.readouterr().err
    assert main(["bench", "report", str(tmp_path)]) == 2
    assert "holds no bench run" in capsys.readouterr().err
    (tmp_path / "requests.jsonl").write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    (tmp_path / "rounds.jsonl").write_text("")
    assert main(["bench", "report", str(tmp_path)]) == 2
    assert "requests.jsonl:2 is not JSON" in capsys.readouterr().err
    assert main(["bench", "batch", "--sequences", "1"]) == 2
    assert "--sequences 1 is invalid" in capsys.readouterr().err
    url = ["bench", "load", "--url", "http://127.0.0.1:9"]
    assert main([*url, "--rounds", "0"]) == 2
    assert "--rounds 0 is invalid" in capsys.readouterr().err
    assert main([*url, "--requests", "0"]) == 2
    assert "--requests 0 is invalid" in capsys.readouterr().err
    assert main(["bench", "load", "--url", "ftp://127.0.0.1:9"]) == 2
    assert "--url 'ftp://127.0.0.1:9' is not an http(s) URL" in capsys.readouterr().err
    assert main(["bench", "load", "--url", "a=http://h:1,a=http://h:2"]) == 2
    assert "names the server 'a' twice" in capsys.readouterr().err
    assert main([*url, "--soak", "0"]) == 2
    assert "--soak 0 / --sample-every 60 is invalid" in capsys.readouterr().err
    assert main([*url, "--soak", "60", "--concurrency", "1,2"]) == 2
    assert "give one --url, one --concurrency" in capsys.readouterr().err


def test_batch_bench_measures_shapes_and_prices_them_by_their_passes(smollm2_path, tmp_path):
    from specwise.backends.llama_cpp import LlamaCppLM
    from specwise.bench.backend import batch_costs

    lm = LlamaCppLM(smollm2_path, context_length=64, max_sequences=3)
    got = batch_costs(lm, sequences=2, repeats=1, context=16)
    rows = {(r["sequences"], r["shape"], r.get("m")): r for r in got["rows"]}
    assert {(1, "all", m) for m in (0, 1, 2, 3, 4, 8)} <= set(rows)
    one = rows[(2, "one +3", None)]
    assert one["passes"] == [(2, 1), (1, 3)]
    assert one["predicted_ms"] == pytest.approx(rows[(2, "all", 0)]["ms"] + got["curve"][3])
    assert rows[(2, "gap, +0", None)]["passes"] == [(1, 1), (1, 1)]
    assert all(r["ms"] > 0 for r in got["rows"])
    assert all(lm.length(q) == 0 for q in range(3))  # released


def test_lossy_rules_are_measured_apart_from_every_exact_figure(smollm2_path, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["bench", "--target", str(smollm2_path), "--categories", "chat", "--limit", "2"]
    args += ["--max-tokens", "10", "--drafter", "ngram", "--k", "2", "--temperature", "1"]
    code = main([*args, "--acceptance", "typical,top-2", "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    exact = summary["figures"]["chat"]["T=1"]
    assert set(exact) == {"plain", "ngram k=2"}  # no lossy configuration among them
    lossy = summary["lossy"]["chat"]["T=1"]
    assert set(lossy) == {"ngram k=2 (lossy: typical)", "ngram k=2 (lossy: top-2)"}
    assert all(0.0 <= f["same_as_exact"] <= 1.0 for f in lossy.values())
    records = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    flagged = [r for r in records if r["acceptance"] != "exact"]
    assert len(flagged) == 4 and all(r["summary"]["acceptance"] == r["acceptance"] for r in flagged)
    assert all("exact_prefix" in r["check"] for r in flagged)
    report = (out / "report.md").read_text()
    assert "Lossy acceptance rules: NOT the target's distribution" in report
    summary, main_tables = report.split("## Lossy")[0].split("```\n\n", 1)  # the printed text
    assert "lossy:" not in main_tables
    assert "LOSSY rules, not the target's distribution" in summary


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--acceptance", "typical", "--temperature", "0"], "needs a sampled run"),
        (["--acceptance", "loose", "--temperature", "1"], "is not a rule"),
    ],
)
def test_bench_refuses_a_lossy_rule_it_cannot_measure(smollm2_path, capsys, extra, words):
    assert main(["bench", "--target", str(smollm2_path), *extra]) == 2
    assert words in capsys.readouterr().err


def test_bench_auto_runs_over_the_drafters_serve_uses_by_default(
    tmp_path, monkeypatch
):
    """Without --drafter, `auto` in the bench is serve's `auto` (n-gram, suffix, the
    draft model, and the eagle layer shipped or trained for the target); the numeric k's run
    the draft model and the n-gram drafter. Asking does not pull the target."""
    from specwise.cli import build_parser
    from specwise.cli.bench import _bench_drafters
    from specwise.drafters import eagle
    from specwise.models import DEFAULT_PAIR, PAIRS

    def drafters(*args):
        return _bench_drafters(build_parser().parse_args(["bench", *args]))

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))  # no model pulled
    assert eagle.shipped_path(PAIRS[DEFAULT_PAIR].target).is_file()
    every = ["ngram", "suffix", "model", "eagle"]
    assert drafters() == (every, ["model", "ngram"])  # the default pair ships a layer
    assert drafters("--quick") == (every, ["model", "ngram"])
    assert drafters("--drafter", "ngram,eagle")[0] == ["ngram", "eagle"]
    assert drafters("--backend", "llama_cpp") == (every[:3], ["model", "ngram"])
    assert not (tmp_path / "models").exists()  # nothing pulled

    assert drafters("--target", "m.gguf") == (["ngram", "suffix"], ["ngram"])
    assert drafters("--k", "4") == (["model", "ngram"], ["model", "ngram"])
    assert drafters("--drafter", "ngram,heads") == (["ngram", "heads"], None)
    assert drafters("--fixed-drafter", "ngram") == (every, ["ngram"])


def test_quick_runs_auto_alone_against_plain_which_is_what_its_verdict_reads():
    """`bench --quick` (make demo): one prompt a category, 64 tokens, k=auto and plain (with
    the mainline baseline where the target is on ik_llama); flags given beside it win."""
    from specwise.cli import build_parser
    from specwise.cli.bench import _quick

    a = build_parser().parse_args(["bench", "--quick"])
    _quick(a)
    assert (a.limit, a.max_tokens, a.k) == (1, 64, ["auto"])
    a = build_parser().parse_args(["bench", "--quick", "--k", "4,auto", "--limit", "2"])
    _quick(a)
    assert (a.limit, a.k) == (2, [4, "auto"])
    runner = Runner(ToyLM(vocab=12, seed=0), None, Options(drafters=["ngram"], ks=a.k[1:]))
    assert list(runner.engines) == ["plain", "auto"]
