"""`specwise bench drafts` (`bench.drafts`): greedy agreement by teacher forcing, the accepted
run lengths it implies, the rows and table, and its flags' errors."""

from __future__ import annotations

import numpy as np
import pytest

from specwise.bench import drafts
from specwise.bench.replay import Recording
from specwise.cli import main
from specwise.oracle import plain_decode
from specwise.sampling import SamplingParams
from toy import ToyLM

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def test_a_chain_keeps_the_run_of_agreements_from_each_position_up_to_k():
    a = np.array([1, 1, 0, 1], np.int8)
    assert drafts.expected_accepted([a], 1) == 0.75  # α
    assert drafts.expected_accepted([a], 2) == (2 + 1 + 0 + 1) / 4
    assert drafts.expected_accepted([a, np.array([1, 1, 1], np.int8)], 8) == (2 + 1 + 0 + 1 + 6) / 7


def test_agreement_is_the_drafts_argmax_on_the_targets_answer():
    target = ToyLM(vocab=12, seed=1)
    answer = plain_decode(target, PROMPT, SamplingParams(max_tokens=12))
    rec = Recording("chat", "p", PROMPT, answer)
    assert drafts.agreement(ToyLM(vocab=12, seed=1), rec).tolist() == [1] * len(answer)
    other = ToyLM(vocab=12, seed=5)
    want = [
        int(np.argmax(other.next_logits(PROMPT + answer[:i]))) == t for i, t in enumerate(answer)
    ]
    assert drafts.agreement(other, rec).tolist() == [int(w) for w in want]


def test_rows_and_table_for_drafts_side_by_side():
    target = ToyLM(vocab=12, seed=1, delay_ms=(2.0, 0.5))
    recs = [
        Recording(c, c, PROMPT, plain_decode(target, PROMPT, SamplingParams(max_tokens=10)))
        for c in ("chat", "math")
    ]
    lms = {
        "self": ToyLM(vocab=12, seed=1, delay_ms=(1.0, 0.5)),
        "other": ToyLM(vocab=12, seed=5, delay_ms=(1.0, 0.5)),
    }
    rows, curve = drafts.compare(target, lms, recs, {"self": 10.0, "other": 5.0})
    assert [r.name for r in rows] == ["self", "other"] and curve[1] > 0
    same, other = rows
    assert same.alpha == 1.0 and same.expected[3] > other.expected[3]
    assert set(same.alpha_by_category) == {"chat", "math"}
    assert 1 <= same.best_k <= drafts.MAX_K and same.predicted > other.predicted
    lines = drafts.table(rows, curve[1])
    assert lines[0].startswith("| draft | MiB | ms a token") and "| self | 10 |" in lines[2]


def test_an_unknown_recipe_is_one_sentence_before_any_model_loads(capsys):
    assert main(["bench", "drafts", "--recipes", "q4_0,q9"]) == 2
    assert "--recipes names 'q9', not a requantization recipe; use some of: q4_0" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("tokens", ["1", "0"])
def test_too_few_tokens_is_one_sentence(tokens, capsys):
    assert main(["bench", "drafts", "--max-tokens", tokens]) == 2
    assert f"--max-tokens {tokens} is invalid" in capsys.readouterr().err


def test_a_requantized_draft_is_not_what_it_compares(capsys):
    assert main(["bench", "drafts", "--draft", "qwen2.5-coder-0.5b-instruct@q4_0"]) == 2
    assert "give the draft itself (--draft qwen2.5-coder-0.5b-instruct)" in capsys.readouterr().err
