"""The bench's report: the recommendation per category and sampling, and the outputs: the text
for people (`Report.table`, laid out by `bench.console`), `summary.json` and `report.md`, which
holds every configuration's detail in one fixed order (`Report`, made by `build`).

The figures are `bench.figures`' (speedups over plain decoding on the same prompts, their
intervals, acceptance, hindsight, per prompt, the lossy rules apart); this module decides one
thing from them: speculation is recommended for a category only when the best configuration's
95% interval lies above 1 (it beats plain by more than the measured noise). It computes no
figure, and writes only the two files it is asked to (`Report.write`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from specwise.bench.console import fmt, gap_list, pass_text, text
from specwise.bench.figures import against_hindsight, aggregate, baseline, by_request

__all__ = ["Report", "against_hindsight", "build", "by_request"]


class Report:
    """The aggregated run: figures[category][sampling][spec], plus 'all' over categories."""

    def __init__(
        self,
        figures: dict,
        recommendation: dict,
        run: dict,
        requests: dict | None = None,
        lossy: dict | None = None,
    ) -> None:
        self.figures, self.recommendation, self.run = figures, recommendation, run
        self.hindsight = against_hindsight(figures)
        self.requests = requests or {}  # by_request: sampling -> spec -> one row per prompt
        self.lossy = lossy or {}  # lossy acceptance rules' figures, never among the above

    def summary(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "figures": self.figures,
            "recommendation": self.recommendation,
            "auto_vs_hindsight": self.hindsight,
            "by_request": self.requests,
            "lossy": self.lossy,
        }

    # -- text --------------------------------------------------------------------------------
    def failures(self) -> list[str]:
        """'category · sampling · configuration' for each exact configuration whose output
        failed its equivalence check (a greedy divergence beyond a near-tie, a sampled
        log-probability off by more than the noise)."""
        return [
            f"{cat} · {s} · {spec}"
            for cat, by_s in self.figures.items()
            if cat != "all"
            for s, by_spec in by_s.items()
            for spec, f in by_spec.items()
            if f.get("equivalence_ok") is False
        ]

    def table(self) -> str:
        """What the bench prints for people (`bench.console`): a table per sampling, exactness,
        the verdict."""
        return text(self.figures, self.lossy, self.run, self.failures())

    def markdown(self) -> str:
        out = [
            "# specwise bench report",
            "",
            f"Command: `{self.run.get('command', '')}`",
            "",
            f"Target `{self.run.get('target')}`, draft `{self.run.get('draft')}`, "
            f"{self.run.get('threads')} threads, max_tokens {self.run.get('max_tokens')}, "
            f"repeats {self.run.get('repeats')}, {self.run.get('prompts')} prompts, "
            f"{self.run.get('duration_s', 0):.0f} s.",
            "",
            "Speedup = tokens/s over plain decoding on the same prompts, measured side by side "
            "in one process, on decode time (total minus the target's prompt prefill, which "
            "is the same work for every configuration; a draft model's prefill counts "
            "against it); tok/s = tokens per second of that decode time; e2e = the speedup "
            "on total time. Acceptance rate = Σ accepted / Σ proposed at that configuration's "
            "k; τ = emitted per round; tok/ms = goodput (emitted per ms of rounds). "
            "Exactness: greedy = token-for-token match with plain, and where a text parted, the "
            "target's top-2 logit gap there (a near-tie: at most the bound the run measured, "
            f"{_bound(self.run)}; `--exact` takes the kernels that round differently out); "
            "sampled = paired difference of the target's mean log-probability, |z| <= 3.",
            "",
            "## Summary (as the bench printed it)",
            "",
            "```text",
            self.table(),
            "```",
            "",
        ]
        for cat, by_s in self.figures.items():
            for sampling, by_spec in by_s.items():
                out += [
                    f"## {cat} · {sampling}",
                    "",
                    "| configuration | tok/s | speedup | 95% CI | median | e2e | acceptance rate "
                    "| τ | α by position | tok/ms | TTFT ms | draft / verify / overhead | "
                    "exactness |",
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
                ]
                for spec, f in by_spec.items():
                    out.append(_md_row(spec, f))
                out += _tree_lines(by_spec)
                out += _offer_lines(by_spec)
                out += _verify_lines(by_spec, self.run) if cat == "all" else []
                rec = self.recommendation.get(cat, {}).get(sampling)
                if rec:
                    out += ["", f"**Recommendation:** {rec['text']}"]
                if baseline(by_spec):
                    out += ["", _baseline_line(by_spec)]
                out.append("")
        if self.hindsight:
            out += [
                "## k=auto against hindsight",
                "",
                "auto / best = auto's speedup over the better of plain (1.00) and the best fixed "
                "configuration of the row, chosen after the fact.",
                "",
                "| category | sampling | auto | best fixed (hindsight) | auto / best | "
                "fixed configurations faster than auto |",
                "|---|---|---|---|---|---|",
            ]
            for cat, by_s in self.hindsight.items():
                for sampling, h in by_s.items():
                    out.append(
                        f"| {cat} | {sampling} | {fmt(h['auto'])}x | {h['best_fixed']} "
                        f"{fmt(h['best_fixed_speedup'])}x | {fmt(h['ratio'])} | "
                        f"{', '.join(h['faster_than_auto']) or 'none'} |"
                    )
            out.append("")
        passed = [
            (cat, sampling, spec, f)
            for cat, by_s in self.figures.items()
            for sampling, by_spec in by_s.items()
            for spec, f in by_spec.items()
            if "pass_at_1" in f
        ]
        if passed:
            out += [
                "## pass@1: the answers' programs run against the problems' tests",
                "",
                "pass@1 = the share of answers whose program passed; Δ = the mean paired "
                "difference against plain decoding of the same prompts, in percentage points, "
                "with a 95% bootstrap interval over prompts.",
                "",
                "| category | sampling | configuration | pass@1 (Δ against plain, 95% CI) |",
                "|---|---|---|---|",
            ]
            out += [f"| {c} | {s_} | {spec} | {pass_text(f)} |" for c, s_, spec, f in passed]
            out.append("")
        out += _by_prompt_lines(self.requests)
        if self.lossy:
            out += [
                "## Lossy acceptance rules: NOT the target's distribution",
                "",
                "Measured apart and in no table above. Speedup as above, against exact plain "
                "decoding of the same prompts; Δ log-prob = the target's mean log-probability "
                "of the output minus plain's (paired by prompt, ± its standard error): what the "
                "rule cost in the target's own judgement; same as exact = the share of requests "
                "whose output equals the same configuration's exact run with the same seed; "
                "exact prefix = how much of that output it followed before parting, on average; "
                "pass@1 (where the prompts have tests) as in the pass@1 section, against exact "
                "plain decoding.",
                "",
                "| category | sampling | configuration | speedup | 95% CI | acceptance rate | τ | "
                "Δ log-prob | same as exact | exact prefix | pass@1 |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for cat, by_s in self.lossy.items():
                for sampling, by_spec in by_s.items():
                    for spec, f in by_spec.items():
                        lo, hi = f["speedup_ci95"]
                        d = f.get("logprob_diff") or {}
                        out.append(
                            f"| {cat} | {sampling} | {spec} | {fmt(f['speedup_total'])}x | "
                            f"{fmt(lo)}–{fmt(hi)} | {fmt(f['acceptance_rate'])} | "
                            f"{fmt(f['mean_accepted_length'])} | {fmt(d.get('mean'), '+.3f')} ± "
                            f"{fmt(d.get('se'), '.3f')} | {fmt(100 * f['same_as_exact'], '.0f')}% | "
                            f"{fmt(100 * f['exact_prefix'], '.0f')}% | {pass_text(f)} |"
                        )
            out.append("")
        return "\n".join(out)

    def write(self, folder: Path) -> None:
        (folder / "summary.json").write_text(json.dumps(self.summary(), indent=1, default=_json))
        (folder / "report.md").write_text(self.markdown())


def _json(x):
    if isinstance(x, float | np.floating) and math.isnan(x):
        return None
    return str(x)


def _bound(run: dict) -> str:
    bound = run.get("near_tie_below")
    if bound == -math.inf:
        return "none in exact mode, where every divergence fails"
    return fmt(bound, ".3f", "not recorded")


def _equiv(spec: str, f: dict) -> str:
    """A configuration's exactness in words: greedy, how many texts were identical to plain's
    and the top-2 gaps where the others parted; sampled, the log-probability test."""
    if spec == "plain":
        return "the reference"
    if "greedy_match_rate" in f:
        n, divs = f["requests"], f["divergences"]
        near = [d for d in divs if d["near_tie"]]
        bad = [d for d in divs if not d["near_tie"]]
        out = f"identical to plain on {n - len(divs)} of {n}"
        out += f"; {len(near)} parted at near-ties (top-2 gap {gap_list(near)})" if near else ""
        return out + (f"; {len(bad)} FAILED (top-2 gap {gap_list(bad)})" if bad else "")
    if "logprob_diff" in f:
        d = f["logprob_diff"]
        judged = {True: "within noise", False: "FAILED", None: f"{d['n']} prompts: 5 to judge"}
        return f"Δ log-prob z={d['z']:+.1f}, {judged[f['equivalence_ok']]}"
    return "timed only (another library or mode)"


def _md_row(spec: str, f: dict) -> str:
    lo, hi = f["speedup_ci95"]
    if spec == "plain":
        ci = "the reference"
    elif math.isnan(lo):
        ci = f"{f['prompts']} prompt: none"
    else:
        ci = f"{fmt(lo)}–{fmt(hi)}"
    alpha = " ".join(fmt(a) for a in f["alpha_per_position"]) or "no drafts"
    split = "/".join(
        fmt(100 * (f[k] or 0), ".0f") for k in ("draft_share", "verify_share", "overhead_share")
    )
    return (
        f"| {spec} | {fmt(f.get('decode_tokens_per_s'), '.1f')} | {fmt(f['speedup_total'])}x | "
        f"{ci} | {fmt(f['speedup_median'])} | {fmt(f['speedup_e2e'])} | "
        f"{fmt(f['acceptance_rate'], '.2f', 'no drafts')} | {fmt(f['mean_accepted_length'])} | "
        f"{alpha} | {fmt(f['goodput_tokens_per_ms'], '.4f')} | {fmt(f['ttft_ms'], '.0f')} | "
        f"{split} % | {_equiv(spec, f)} |"
    )


def _tree_lines(by_spec: dict[str, dict]) -> list[str]:
    """A sentence per configuration that drafted trees: how often, how big, how deep."""
    out = []
    for spec, f in by_spec.items():
        t = f.get("trees")
        if t:
            out.append(
                f"- {spec}: trees in {100 * t['share']:.0f}% of the rounds that drafted, "
                f"{t['tokens']:.1f} tokens {t['depth']:.1f} deep on average, "
                f"{t['accepted']:.2f} accepted"
            )
    return ["", "Tree drafts:", *out] if out else []


def _offer_lines(by_spec: dict[str, dict]) -> list[str]:
    """A sentence per configuration and cheap drafter asked for offers before its plans: how
    often, what an offer took, and how much of what was asked (and paid for) was drafted
    from."""
    out = [
        f"- {spec}: {name} asked in {o['rounds']} rounds, {o['asked']:.1f} tokens a round"
        + ("" if o.get("ms") is None else f", {o['ms']:.2f} ms an offer (median)")
        + f"; drafted from in {100 * o['taken']:.0f}% of them, {o['drafted']:.1f} tokens a round"
        for spec, f in by_spec.items()
        for name, o in (f.get("offers") or {}).items()
    ]
    head = "Offers asked before the plan (paid for whether drafted from or not):"
    return ["", head, *out] if out else []


def _verify_lines(by_spec: dict[str, dict], run: dict) -> list[str]:
    """A line per configuration whose rounds fed the target more than one token a call: the
    median ms of a call by the tokens fed, and each as a multiple of a one-token call; then
    the curve `auto` was calibrated with, alone, for comparison."""

    def line(name: str, v: dict[int, float]) -> str:
        sizes = sorted(v)[:8]
        return f"- {name}: " + ", ".join(
            f"{n} {v[n]:.1f}" + ("" if n == 1 else f" ({v[n] / v[1]:.2f}x)") for n in sizes)

    out = []
    for spec, f in by_spec.items():
        v = {int(n): ms for n, ms in (f.get("verify") or {}).items()}
        if len(v) >= 2 and 1 in v:
            out.append(line(spec, v))
    calibrated = {int(n): ms for n, ms in (run.get("calibrated_ms") or {}).items()}
    if out and 1 in calibrated:
        out.append(line("calibrated alone, as `auto` started", calibrated))
    head = "Target calls of one sequence, median ms by tokens fed (x a one-token call):"
    return ["", head, *out] if out else []


def _recommend(by_spec: dict[str, dict]) -> dict[str, Any]:
    cands = {
        s: f
        for s, f in by_spec.items()
        if not s.startswith("plain") and f["speedup_total"] is not None
    }
    if not cands:
        return {"best": "plain", "speculate": False, "text": "plain decoding (nothing else ran)"}
    # Ranked by goodput over decode time relative to plain on the same prompts (speedup): the
    # rounds-only goodput leaves out a draft model's prompt prefill, which speculation pays.
    best = max(cands, key=lambda s: cands[s]["speedup_total"])
    f = cands[best]
    lo, hi = f["speedup_ci95"]
    prompts = f.get("prompts", 0)
    on = not math.isnan(lo) and lo > 1.0
    measured = f"{best} at {fmt(f['speedup_total'])}x plain"
    if math.isnan(lo):  # one prompt: a ratio, but no spread to judge it by
        verdict = (
            f"not enough prompts to decide ({prompts or 'one'} prompt, no interval; "
            f"run more with --limit 3 or more)"
        )
        text = f"{verdict}; measured best: {measured}"
    else:
        verdict = (
            "speculate" if on else "do not speculate (no configuration beats plain beyond noise)"
        )
        text = (
            f"{verdict}; best goodput (decode, draft prefill included): {measured} "
            f"(95% CI over {prompts} prompts {fmt(lo)}–{fmt(hi)})"
        )
    return {
        "best": best if on else "plain",
        "best_speculative": best,
        "speculate": on,
        "speedup": f["speedup_total"],
        "ci95": [lo, hi],
        "text": text,
    }


def _baseline_line(by_spec: dict[str, dict]) -> str:
    """'over plain on llama_cpp: plain 1.45x, auto 1.60x, ...' (a baseline ran)."""
    base = baseline(by_spec)
    return f"over {base}: " + ", ".join(
        f"{spec} {fmt(f.get('speedup_vs_baseline'))}x"
        for spec, f in by_spec.items()
        if spec != base
    )


def _by_prompt_lines(requests: dict[str, dict[str, list[dict]]]) -> list[str]:
    """`by_request` as a markdown table per sampling: a row per prompt, a cell per
    configuration (speedup over plain, acceptance rate in brackets)."""
    out: list[str] = []
    for sampling, by_spec in requests.items():
        specs = list(by_spec)
        rows: dict[str, dict[str, dict]] = {}
        for spec, recs in by_spec.items():
            for r in recs:
                rows.setdefault(r["prompt_id"], {})[spec] = r
        out += [
            f"## By prompt · {sampling}",
            "",
            "Speedup over plain decoding on the prompt (acceptance rate in brackets).",
            "",
            "| prompt | " + " | ".join(specs) + " |",
            "|---" * (len(specs) + 1) + "|",
        ]
        for pid, cells in rows.items():
            text = [
                f"{fmt(c['speedup'])}x ({fmt(c['acceptance_rate'])})" if c else "-"
                for c in (cells.get(spec) for spec in specs)
            ]
            out.append(f"| {pid} | " + " | ".join(text) + " |")
        out.append("")
    return out


def build(records: list[dict], rounds: Iterable[dict], run: dict) -> Report:
    """Aggregate request records and round records into a Report (`figures.aggregate`; lossy
    configurations apart: `Report.lossy`), with a recommendation per category and sampling."""
    figures, requests, lossy = aggregate(records, rounds)
    recommendation = {
        cat: {sampling: _recommend(figs) for sampling, figs in by_s.items()}
        for cat, by_s in figures.items()
    }
    return Report(figures, recommendation, run, requests, lossy)
