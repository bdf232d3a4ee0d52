"""What the inspector shows of a round: origins, p and q at each position, pieces of text, and an
inspected request decoding exactly as an uninspected one."""

from __future__ import annotations

import numpy as np
import pytest

from specwise import Engine, SamplingParams
from specwise.backends.torch_hf import TorchLM
from specwise.detail import origins, round_detail
from specwise.detok import pieces
from specwise.drafters import ModelDrafter, NgramDrafter
from toy import tiny_llama

PROMPT = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]


@pytest.mark.parametrize(
    ("proposed", "accepted", "bonus", "emitted", "want"),
    [
        (0, 0, True, 1, ["plain"]),
        (3, 3, True, 4, ["accepted"] * 3 + ["bonus"]),
        (3, 1, False, 2, ["accepted", "recovered"]),
        (3, 0, False, 1, ["recovered"]),
        (3, 3, True, 2, ["accepted"] * 2),  # cut by EOS / a stop / max_tokens inside the draft
        (4, 2, False, 0, []),
    ],
)
def test_origins(proposed, accepted, bonus, emitted, want):
    assert origins(proposed, accepted, bonus, emitted) == want


LOGITS = np.log(
    np.array(
        [[0.1, 0.6, 0.2, 0.1], [0.5, 0.1, 0.1, 0.3], [0.25, 0.25, 0.25, 0.25]], dtype=np.float64
    )
)


def test_round_detail_of_a_sampled_chain_with_q():
    q = np.array([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0]])
    # Draft 1, 3: 1 kept (position 0), 3 rejected at position 1 and 0 recovered there.
    d = round_detail([1, 3], q, None, (), [1, 0], LOGITS, [0, 1], SamplingParams(temperature=1.0))
    assert d["p_kind"] == "warped" and d["draft"] == [1, 3] and d["tokens"] == [1, 0]
    a, b = d["positions"]
    assert a["proposed"] == 1 and a["p"] == pytest.approx(0.6) and a["q"] == 0.5
    assert a["p_proposed"] == pytest.approx(0.6) and a["q_proposed"] == 0.5
    assert b["proposed"] == 3 and b["p_proposed"] == pytest.approx(0.3) and b["q_proposed"] == 1.0
    assert b["p"] == pytest.approx(0.5) and b["q"] == 0.0
    assert [t[0] for t in a["top"]] == [1, 2, 0, 3]  # ties in p: the lower id first
    assert [t[2] for t in b["top"]] == pytest.approx([0.5, 0.3, 0.1, 0.1])
    assert a["gap"] == pytest.approx(np.log(0.6 / 0.2))
    assert a["top"][0][1] is None and d["pieces"] is None  # no tokenizer: no text


def test_round_detail_of_a_greedy_point_mass_draft_and_a_bonus():
    params = SamplingParams(temperature=0.0)
    # A point-mass draft of one token, kept, then the bonus from row 1; p shown as softmax.
    d = round_detail([1], None, None, (), [1, 0], LOGITS, [0, 1], params)
    a, b = d["positions"]
    assert d["p_kind"] == "softmax"
    assert a["q"] == 1.0 and a["q_proposed"] == 1.0 and a["p"] == pytest.approx(0.6)
    assert b["proposed"] is None and b["q"] is None and b["p_proposed"] is None
    assert d["params"]["temperature"] == 0.0


def test_round_detail_of_a_tree_follows_its_kept_path():
    # Tree: node 0 (token 2) and node 1 (token 1) under the root, node 2 (token 3) under node 1.
    # Kept path: node 1 then node 2; rows 0, 2, 3 of the fed logits.
    logits = np.log(np.full((4, 4), 0.25))
    d = round_detail(
        [2, 1, 3], None, [-1, -1, 1], (1, 2), [1, 3, 0], logits, [0, 2, 3], SamplingParams()
    )
    assert [p["proposed"] for p in d["positions"]] == [1, 3, None]
    assert d["parents"] == [-1, -1, 1]


class Chars:
    """A tokenizer whose ids are UTF-8 bytes: a character can span tokens."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_pieces_hold_a_character_split_across_tokens_on_its_last_token():
    ids = list("aé€".encode())  # 1 + 2 + 3 bytes
    assert pieces(Chars(), ids) == ["a", "", "é", "", "", "€"]
    assert "".join(pieces(Chars(), ids[3:], ids[:3])) == "€"  # the context completes nothing


@pytest.fixture(scope="module")
def target():
    return TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_an_inspected_request_decodes_exactly_as_one_not_inspected(target, kind, temperature):
    drafter = NgramDrafter() if kind == "ngram" else ModelDrafter(TorchLM(target.model))
    params = SamplingParams(temperature=temperature, seed=7, max_tokens=30)
    eng = Engine(target, drafter, k=3)
    plain = eng.generate(PROMPT, params)
    req = eng.start(PROMPT, params, inspect=True)
    while not req.done:
        eng.step([req])
    got = eng.finish(req)
    assert got.tokens == plain.tokens
    assert len(req.details) == len(got.rounds)
    assert [t for d in req.details for t in d["tokens"]] == got.tokens
    for rt, d in zip(got.rounds, req.details, strict=True):
        assert d["draft"][: rt.proposed] == d["draft"] and len(d["draft"]) == rt.proposed
        assert len(d["positions"]) == rt.emitted
        for i, pos in enumerate(d["positions"]):
            assert 0.0 <= pos["p"] <= 1.0
            if temperature == 0.0:  # greedy: the emitted token is p's most likely
                assert pos["token"] == pos["top"][0][0]
            if i < rt.accepted:
                assert pos["proposed"] == pos["token"]
        assert not d["params_changed"]
    assert any(rt.proposed for rt in got.rounds)
