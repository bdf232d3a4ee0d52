"""What `specwise bench` prints for people (`bench.console`), on hand-made records the size of
`specwise bench --quick` (`make demo`): a table per sampling with a row per category, the
configurations in one order whatever order the run met them in, exactness in words (never a
bare percentage, never a bare dash), one verdict line, and few enough lines to read."""

from __future__ import annotations

import re

from specwise.bench.report import build
from specwise.prompts import CATEGORIES

# --quick's prompts on the default pair (one per category, at each category's own sampling) and
# its configurations (plain, the mainline baseline, auto), with the fixed k=4 configurations of
# the draft model and the n-gram drafter that a fuller run adds beside them.
SPECS = ["plain", "plain on llama_cpp", "model k=4", "ngram k=4", "auto"]
DECODE_MS = {"plain": 4000, "plain on llama_cpp": 4600, "model k=4": 4200, "ngram k=4": 3800}
RUN = {"command": "test", "near_tie_below": 0.12, "numeric_noise": {"logit": 0.1, "top2_gap": 0.06}}


def sampling_of(cat) -> str:
    return f"T={cat.temperature:g}" + (f" top_p={cat.top_p:g}" if cat.top_p < 1 else "")


def summary(spec: str, decode_ms: float) -> dict:
    plain = spec.startswith("plain")
    return {
        "emitted": 64,
        "total_ms": decode_ms + 300,
        "prefill_ms": 300,
        "draft_prefill_ms": 0.0,
        "ttft_ms": 310,
        "proposed": 0 if plain else 40,
        "accepted": 0 if plain else 20,
        "rounds": 64 if plain else 40,
        "draft_ms": 0.0,
        "verify_ms": decode_ms,
        "overhead_ms": 0.0,
        "continuation_tokens_per_s": 16.0,
        "peak_rss_mb": 900.0,
    }


def check(spec: str, greedy: bool, parted: dict | None) -> dict:
    if spec == "plain on llama_cpp":
        return {}  # another library: timed only
    if not greedy:
        return {"mean_logprob": -1.0, "n_tokens": 64}
    if parted and spec != "plain":
        return {"match": False, "position": 20, **parted}
    return {"match": True}


def quick_run(parted: dict[str, dict] | None = None) -> tuple[list[dict], list[dict]]:
    """Records and auto's rounds of a --quick-sized run. `parted`: category -> the check of
    every speculative configuration there whose greedy text parted from plain's. The
    configurations come in the run's rotated order, a different one for every prompt."""
    records, rounds = [], []
    for i, (name, cat) in enumerate(CATEGORIES.items()):
        sampling = sampling_of(cat)
        for spec in SPECS[i % len(SPECS) :] + SPECS[: i % len(SPECS)]:
            ms = DECODE_MS.get(spec, 3400 - 40 * i)
            records.append(
                {
                    "config": f"{spec} | {sampling}",
                    "spec": spec,
                    "sampling": sampling,
                    "acceptance": "exact",
                    "category": name,
                    "prompt_id": f"{name}-1",
                    "repeat": 0,
                    "summary": summary(spec, ms),
                    "check": check(spec, cat.temperature == 0, (parted or {}).get(name)),
                }
            )
        for r in range(40):  # auto: ngram, suffix, plain, plain, model, ...
            drafter = ("ngram", "suffix", None, None, "model")[r % 5]
            rounds.append(
                {
                    "request_id": name,
                    "round": r,
                    "drafter": drafter,
                    "proposed": 3 if drafter else 0,
                    "accepted": 1 if drafter else 0,
                    "rejection_position": None,
                    "bonus": False,
                    "emitted": 2,
                    "draft_ms": 1.0,
                    "verify_ms": 50.0,
                    "overhead_ms": 1.0,
                    "batch_size": 1,
                    "t_ms": 12.0,
                    "category": name,
                    "config": f"auto | {sampling}",
                }
            )
    return records, rounds


NEAR = {"top2_gap": 0.01, "near_tie": True}


def bare_cells(text: str) -> list[str]:
    """Cells (what two or more spaces part) that are only dashes ('-', '---', '-–-') or only a
    percentage ('0%', '100%': an exactness said as a bare number)."""
    bare = re.compile(r"^[-–]+$|^\d+(\.\d+)?%$")
    return [
        cell
        for line in text.splitlines()
        for cell in re.split(r"\s{2,}", line.strip())
        if bare.match(cell)
    ]


def test_a_quick_run_prints_a_table_per_sampling_and_a_verdict_in_few_lines():
    records, rounds = quick_run({"summarization": NEAR, "translation": {**NEAR, "top2_gap": 0.03}})
    text = build(records, rounds, RUN).table()
    lines = text.splitlines()
    # `make demo` prints its pull and the backend choice too; the whole must stay within 60.
    assert len(lines) <= 40, text
    titles = [line for line in lines if "tokens/s of decoding" in line]
    assert [t.split(" · ")[0] for t in titles] == ["T=0", "T=0.7 top_p=0.9", "T=1 top_p=0.95"]
    heads = [line.split() for line in lines if line.startswith("category")]
    assert len(heads) == 3 and all(h == heads[0] for h in heads)  # the same columns each time
    assert heads[0][:5] == ["category", "plain", "auto", "auto/plain", "(95%"]
    t0 = lines[lines.index(titles[0]) + 2 : lines.index(titles[0]) + 10]
    assert [row.split()[0] for row in t0] == [
        "code_generation",
        "code_editing",
        "code_explanation",
        "summarization",
        "translation",
        "math",
        "repeated",
        "all",
    ]
    assert "1.18x (1 prompt)" in t0[0]  # one prompt: said, no interval
    assert re.search(r"all \(7 prompts\) .* 1\.\d\dx \(1\.\d\d–1\.\d\d\)", t0[-1])
    assert "ngram 20%, suffix 20%, model 20%" in t0[0]
    assert "exactness: auto's greedy text identical to plain's on 5 of 7 prompts" in text
    assert (
        "2 parted at a near-tie (top-2 gap 0.01, 0.03 ≤ 0.12 = 2× the kernels' noise 0.06); "
        "--exact gives bit-for-bit" in text
    )
    assert "the other configurations: 10 of 14 requests identical, 4 parted at near-ties" in text
    assert "exactness (sampled)" in text and "1 prompt, 5 needed to judge" in text
    assert lines[-1].startswith("verdict: auto 1.")
    assert "at T=0 (95% CI" in lines[-1] and "x plain on llama_cpp" in lines[-1]
    assert not bare_cells(text), bare_cells(text)
    assert "equiv" not in text and "FAIL" not in text


def test_the_report_lists_configurations_in_one_order_whatever_order_they_ran_in():
    records, rounds = quick_run()
    report = build(records, rounds, RUN)
    order = ["plain", "plain on llama_cpp", "auto", "model k=4", "ngram k=4"]
    for by_s in report.figures.values():
        for by_spec in by_s.values():
            assert list(by_spec) == order
    md = report.markdown()
    for cat in CATEGORIES:
        section = md.split(f"## {cat} · ")[1].split("\n## ")[0]
        rows = [line.split(" | ")[0][2:] for line in section.splitlines() if line.startswith("| ")]
        assert rows[1:] == order  # after the header
    assert "## Summary (as the bench printed it)" in md and report.table() in md
    assert "| plain | 16.0 | 1.00x | the reference |" in md
    assert "identical to plain on 1 of 1 |" in md
    assert "1 prompt: none" in md  # no interval, said in words


def test_a_divergence_beyond_a_near_tie_fails_in_the_table_and_the_verdict():
    records, rounds = quick_run({"math": {"top2_gap": 0.5, "near_tie": False}})
    report = build(records, rounds, RUN)
    text = report.table()
    assert "1 FAILED: parted at top-2 gap 0.50 (above the near-tie bound)" in text
    assert (
        "the other configurations: 12 of 14 requests identical, 0 parted at near-ties, 2 FAILED"
        in text
    )
    assert text.splitlines()[-1].startswith(
        "verdict: EQUIVALENCE CHECK FAILED for math · T=0 · auto; math · T=0 · model k=4; "
        "math · T=0 · ngram k=4 (a bug, not noise); auto 1."
    )
    assert report.failures() == [f"math · T=0 · {s}" for s in ("auto", "model k=4", "ngram k=4")]


def test_exact_mode_says_bit_for_bit_and_a_lone_configuration_heads_the_table():
    records = [r for r in quick_run()[0] if r["spec"] in ("plain", "ngram k=4")]
    exact = {**RUN, "near_tie_below": float("-inf")}
    text = build(records, [], exact).table()
    assert "ngram k=4/plain (95% CI)" in text  # no auto ran: the first speculative heads it
    assert (
        "exactness: ngram k=4's greedy text identical to plain's on 7 of 7 prompts, bit for bit"
        in text
    )
    assert "no rounds recorded" in text  # no rounds given: no drafted share to show
    assert text.splitlines()[-1].startswith("verdict: ngram k=4 1.05x plain decoding at T=0")
    assert not bare_cells(text), bare_cells(text)


def test_a_category_where_the_headline_configuration_did_not_run_says_so():
    records, rounds = quick_run()
    records = [r for r in records if not (r["category"] == "math" and r["spec"] == "auto")]
    text = build(records, rounds, RUN).table()
    row = next(line for line in text.splitlines() if line.startswith("math "))
    assert row.split()[1:] == ["16.0", "did", "not", "run"]
