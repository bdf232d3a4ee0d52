"""The bench's report: the recommendation per category and sampling, and the outputs: a table
for people, `summary.json` and `report.md` (`Report`, made by `build`).

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

from specwise.bench.figures import against_hindsight, aggregate, baseline, by_request

__all__ = ["Report", "against_hindsight", "build", "by_request"]


def _pass_text(f: dict) -> str:
    """pass@1 and its change against plain, for a line or a cell ("-" where not measured)."""
    if "pass_at_1" not in f:
        return "-"
    d = f["pass_at_1_delta"]
    lo, hi = d["ci95"]
    return f"{_f(100 * f['pass_at_1'], '.0f')}% (Δ {_f(100 * d['mean'], '+.0f')} pts, {_f(100 * lo, '+.0f')} to {_f(100 * hi, '+.0f')})"


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
    def table(self) -> str:
        lines = []
        head = (
            f"{'configuration':16} {'speedup':>8} {'95% CI':>11} {'median':>6} {'e2e':>5} "
            f"{'acc.rate':>8} {'tau':>5} {'tok/ms':>7} {'TTFT ms':>8} {'draft%':>6} "
            f"{'verify%':>7} {'equiv':>6}"
        )
        for cat, by_s in self.figures.items():
            for sampling, by_spec in by_s.items():
                lines.append(f"\n{cat} · {sampling}")
                lines.append(head)
                for spec, f in by_spec.items():
                    lines.append(_row(spec, f))
                rec = self.recommendation.get(cat, {}).get(sampling)
                if rec:
                    lines.append(f"→ {rec['text']}")
                if baseline(by_spec):
                    lines.append(f"  {_baseline_line(by_spec)}")
                passed = [
                    f"{spec} {_pass_text(f)}" for spec, f in by_spec.items() if "pass_at_1" in f
                ]
                if passed:
                    lines.append("  pass@1: " + "; ".join(passed))
        for cat, by_s in self.lossy.items():
            for sampling, by_spec in by_s.items():
                lines.append(
                    f"\n{cat} · {sampling} · LOSSY acceptance (not the target's distribution)"
                )
                lines += [_lossy_line(spec, f) for spec, f in by_spec.items()]
        return "\n".join(lines)

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
            "against it); e2e = the same on total time. Acceptance rate = Σ accepted / "
            "Σ proposed at that configuration's k; τ = emitted per round; tok/ms = goodput "
            "(emitted per ms of rounds). Equivalence: greedy = token-for-token match with "
            "plain (or a near-tie divergence); sampled = paired difference of the target's "
            "mean log-probability, |z| <= 3.",
            "",
        ]
        for cat, by_s in self.figures.items():
            for sampling, by_spec in by_s.items():
                out += [
                    f"## {cat} · {sampling}",
                    "",
                    "| configuration | speedup | 95% CI | median | e2e | acceptance rate | τ | "
                    "α by position | tok/ms | TTFT ms | draft / verify / overhead | equivalence |",
                    "|---|---|---|---|---|---|---|---|---|---|---|---|",
                ]
                for spec, f in by_spec.items():
                    out.append(_md_row(spec, f))
                out += _tree_lines(by_spec)
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
                        f"| {cat} | {sampling} | {_f(h['auto'])}x | {h['best_fixed']} "
                        f"{_f(h['best_fixed_speedup'])}x | {_f(h['ratio'])} | "
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
            out += [f"| {c} | {s_} | {spec} | {_pass_text(f)} |" for c, s_, spec, f in passed]
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
                            f"| {cat} | {sampling} | {spec} | {_f(f['speedup_total'])}x | "
                            f"{_f(lo)}–{_f(hi)} | {_f(f['acceptance_rate'])} | "
                            f"{_f(f['mean_accepted_length'])} | {_f(d.get('mean'), '+.3f')} ± "
                            f"{_f(d.get('se'), '.3f')} | {_f(100 * f['same_as_exact'], '.0f')}% | "
                            f"{_f(100 * f['exact_prefix'], '.0f')}% | {_pass_text(f)} |"
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


def _f(x, spec=".2f", none="-") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, spec)


def _equiv(f: dict) -> str:
    if "greedy_match_rate" in f:
        return f"{100 * f['greedy_match_rate']:.0f}%" + ("" if f["equivalence_ok"] else " FAIL")
    if "logprob_diff" in f:
        flag = {True: "", False: " FAIL", None: " (n<5)"}[f["equivalence_ok"]]
        return f"z={f['logprob_diff']['z']:+.1f}" + flag
    return "-"


def _row(spec: str, f: dict) -> str:
    lo, hi = f["speedup_ci95"]
    ci = f"{_f(lo)}-{_f(hi)}" if spec != "plain" else "-"
    return (
        f"{spec:16} {_f(f['speedup_total']) + 'x':>8} {ci:>11} {_f(f['speedup_median']):>6} "
        f"{_f(f['speedup_e2e']):>5} {_f(f['acceptance_rate']):>8} "
        f"{_f(f['mean_accepted_length']):>5} "
        f"{_f(f['goodput_tokens_per_ms'], '.4f'):>7} {_f(f['ttft_ms'], '.0f'):>8} "
        f"{_f(100 * (f['draft_share'] or 0), '.0f'):>6} {_f(100 * (f['verify_share'] or 0), '.0f'):>7} "
        f"{_equiv(f):>6}"
    )


def _lossy_line(spec: str, f: dict) -> str:
    d = f.get("logprob_diff") or {}
    passed = f"  pass@1 {_pass_text(f)}" if "pass_at_1" in f else ""
    return (
        f"{spec:32} {_f(f['speedup_total'])}x  acc.rate {_f(f['acceptance_rate'])}  "
        f"Δlogprob {_f(d.get('mean'), '+.3f')}  same as exact {_f(100 * f['same_as_exact'], '.0f')}%"
        f"{passed}"
    )


def _md_row(spec: str, f: dict) -> str:
    lo, hi = f["speedup_ci95"]
    alpha = " ".join(_f(a) for a in f["alpha_per_position"]) or "-"
    split = "/".join(
        _f(100 * (f[k] or 0), ".0f") for k in ("draft_share", "verify_share", "overhead_share")
    )
    return (
        f"| {spec} | {_f(f['speedup_total'])}x | {_f(lo)}–{_f(hi)} | {_f(f['speedup_median'])} | "
        f"{_f(f['speedup_e2e'])} | {_f(f['acceptance_rate'])} | {_f(f['mean_accepted_length'])} | {alpha} | "
        f"{_f(f['goodput_tokens_per_ms'], '.4f')} | {_f(f['ttft_ms'], '.0f')} | {split} % | "
        f"{_equiv(f)} |"
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
    measured = f"{best} at {_f(f['speedup_total'])}x plain"
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
            f"(95% CI over {prompts} prompts {_f(lo)}–{_f(hi)})"
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
        f"{spec} {_f(f.get('speedup_vs_baseline'))}x" for spec, f in by_spec.items() if spec != base
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
                f"{_f(c['speedup'])}x ({_f(c['acceptance_rate'])})" if c else "-"
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
