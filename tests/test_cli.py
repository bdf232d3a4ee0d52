"""`specwise generate` end to end on the smallest real model, and its errors."""

from __future__ import annotations

import json

import pytest

from specwise.cli import main
from toy import SUMMARY_KEYS

PROMPT = "Count from 1 to 30, separated by commas."


def run_json(capsys, *args):
    assert main(["generate", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_json_ngram_and_model_drafter(smollm2_path, capsys, tmp_path):
    base = ["--target", str(smollm2_path), "--max-tokens", "40", "--chat"]
    plain = run_json(capsys, *base, "--k", "0", PROMPT)
    ngram = run_json(capsys, *base, "--drafter", "ngram", "--k", "4", PROMPT)
    trace = tmp_path / "rounds.jsonl"
    model = run_json(
        capsys, *base, "--draft", str(smollm2_path), "--k", "4", "--trace", str(trace), PROMPT
    )
    auto = run_json(capsys, *base, "--draft", str(smollm2_path), PROMPT)  # --k auto by default
    for out in (plain, ngram, model, auto):
        assert set(out["summary"]) >= SUMMARY_KEYS
        assert out["summary"]["emitted"] == len(out["tokens"]) == 40
    assert ngram["tokens"] == plain["tokens"] == model["tokens"] == auto["tokens"]  # exact
    assert ngram["text"] == plain["text"]
    assert model["summary"]["acceptance_rate"] == 1.0  # the model drafting for itself
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(rows) == model["summary"]["rounds"] and rows[1]["drafter"] == "model"


def test_generate_with_a_draft_model_of_another_tokenizer(gemma_path, smollm2_path, capsys):
    """Gemma 3 drafted by SmolLM2 (two vocabularies): it says so, drafts, and sampling with a
    seed runs (greedy equality across tokenizers: tests/test_vocab_map.py)."""
    base = ["--target", str(gemma_path), "--max-tokens", "12", "--backend", "llama_cpp"]
    assert (
        main(["generate", "--json", *base, "--draft", str(smollm2_path), "--k", "3", PROMPT]) == 0
    )
    said = capsys.readouterr()
    assert "model drafter: the draft model has another tokenizer" in said.err
    out = json.loads(said.out.strip().splitlines()[-1])
    assert out["summary"]["emitted"] == 12 and out["summary"]["proposed"] > 0
    args = [*base, "--draft", str(smollm2_path), "--k", "3", "--temperature", "0.8"]
    assert run_json(capsys, *args, "--seed", "3", PROMPT)["summary"]["emitted"] == 12
    # --k auto: the controller may also draft the draft model's text (model-text)
    assert main(["generate", "--json", *base, "--draft", str(smollm2_path), PROMPT]) == 0
    said = capsys.readouterr()
    assert "model-text drafter: it drafts the draft model's argmax text" in said.err
    assert json.loads(said.out.strip().splitlines()[-1])["summary"]["emitted"] == 12


def test_generate_prints_text_then_named_figures(smollm2_path, capsys):
    assert (
        main(
            [
                "generate",
                "--target",
                str(smollm2_path),
                "--drafter",
                "ngram",
                "--max-tokens",
                "16",
                "--temperature",
                "0.7",
                "--seed",
                "1",
                PROMPT,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "acceptance rate (Σ accepted / Σ proposed, chosen per round: auto)" in out
    assert "auto: " in out
    assert "mean accepted length τ" in out and "α per position (conditional)" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "SamplingParams.temperature = -1.0 is invalid"),
        (["--top-p", "0"], "SamplingParams.top_p"),
        (["--drafter", "model"], "--drafter model needs --draft"),
        (["--target", "/no/such/model.gguf"], "does not exist"),
        (["--target", "no-such-name"], "not a model file, folder or catalog name"),
        (["--pair", "nope"], "--pair 'nope' is unknown"),
        (["--k", "-2"], "--k -2 is invalid"),
        (["--drafter", "hydra"], "--drafter 'hydra' is unknown"),
    ],
)
def test_bad_input_is_one_sentence(smollm2_path, capsys, args, message):
    argv = ["generate", *args, "hello"]
    if "--target" not in args and "--pair" not in args:
        argv = ["generate", "--target", str(smollm2_path), *args, "hello"]
    if args[:1] == ["--k"]:  # argparse's own check: usage, then one error line, exit 2
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in last
        return
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prefill-chunk", "-1"], "--prefill-chunk -1 is invalid"),
        (["--whole-prompt", "-1"], "--whole-prompt -1 is invalid"),
        (["--streams-per-key", "-2"], "--streams-per-key -2 is invalid"),
        (["--max-body-mb", "0"], "--max-body-mb 0 is invalid"),
        (["--max-batch", "0"], "--max-batch 0 is invalid"),
        (["--adapt-budget", "-1"], "--adapt-budget -1 is invalid"),
        (["--adapt-idle-budget", "0"], "--adapt-idle-budget 0 is invalid"),
        (["--adapt-buffer", "0"], "--adapt-buffer 0 is invalid"),
        (["--adapt", "key", "--k", "4", "--drafter", "ngram"], "adapts one drafter on hidden"),
        (["--adapt", "global", "--k", "auto", "--drafter", "heads,eagle"], "not both"),
        (["--adapt-cache", "adapted.pt"], "--adapt-cache keeps what --adapt learns"),
    ],
)
def test_bad_serve_options_are_one_sentence_before_any_model_loads(capsys, args, message):
    assert main(["serve", "--target", "/no/such/model.gguf", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_prompt_longer_than_context(smollm2_path, capsys):
    assert (
        main(["generate", "--target", str(smollm2_path), "--max-tokens", "2", "word " * 5000]) == 2
    )
    assert "context holds" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rate", "0.5", "--concurrency", "2", "--stream"], "--rate (an open loop) and"),
        (["--rate", "0.5"], "--rate measures TTFT and the SLO, which need --stream"),
        (["--rate", "0,1", "--stream"], "--rate [0.0, 1.0] is invalid"),
        (["--slo-target", "1.5"], "--slo-target 1.5 is invalid"),
        (["--rate", "1", "--stream", "--soak", "60"], "give no --rate with it"),
    ],
)
def test_bad_load_options_are_one_sentence_before_any_request(capsys, args, message):
    assert main(["bench", "load", "--url", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "-0.5"], "--budget -0.5 is invalid"),
        (["--idle-budget", "0"], "--idle-budget 0 is invalid"),
        (["--think", "-1"], "--think -1 is invalid"),
    ],
)
def test_bad_bench_adapt_options_are_one_sentence_before_any_model_loads(capsys, args, message):
    assert main(["bench", "adapt", "--target", "/no/such/model.gguf", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
