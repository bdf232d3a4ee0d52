"""Bench figures per (category, sampling, configuration), the recommendation, and the outputs:
a table for people, `summary.json` and `report.md`.

Every figure is computed by `specwise.trace` from the recorded rounds, or from the requests'
summaries; this module adds only comparisons against plain decoding on the same prompts:

- speedup: (Σ emitted / Σ decode ms) of the configuration over plain's, where decode ms is
  a request's total time minus the target's prompt prefill — the prefill is the same work for
  every configuration and, on a shared machine, the noisiest part; a draft model's own prefill
  stays in (it is a cost of speculating);
- speedup (median): the median over prompts of the per-prompt ratio of the same rates;
- e2e speedup: the same with total time (prefill included), what a user waits for;
- a 95% bootstrap interval of the speedup over prompts: speculation is recommended for a
  category only when the interval's lower end is above 1 (it beats plain by more than the
  measured noise);
- k=auto against hindsight: auto's speedup over the better of plain and the best *fixed*
  configuration of that category and sampling, chosen after the fact (the controller's bar).

Acceptance figures are per configuration, i.e. at one k, and say so.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from specwise.bench.runner import BASELINE
from specwise.lossy import EXACT
from specwise.trace import (
    RoundTrace,
    acceptance_per_position,
    alpha_per_position,
    choice_shares,
    rejection_histogram,
    tree_figures,
)

__all__ = ["Report", "against_hindsight", "build", "by_request", "ratio_ci"]

BOOTSTRAP = 2000
SAMPLED_Z = 3.0  # |z| above this flags a sampled configuration's distribution
SAMPLED_MIN_N = 5  # prompt pairs needed before a sampled check can flag anything


def _decode_ms(s: dict) -> float:
    return s["total_ms"] - s["prefill_ms"]


def _rate(records: list[dict], e2e: bool = False) -> float:
    emitted = sum(r["summary"]["emitted"] for r in records)
    ms = sum(r["summary"]["total_ms"] if e2e else _decode_ms(r["summary"]) for r in records)
    return emitted / ms if ms else math.nan


def ratio_ci(tokens: np.ndarray, times: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of (Σ tokens_a / Σ times_a) / (Σ tokens_b / Σ times_b) over
    pairs, resampling pairs (rows; columns a, b); NaNs with fewer than 2 pairs."""
    if len(tokens) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tokens), size=(BOOTSTRAP, len(tokens)))
    es, ts = tokens[idx].sum(axis=1), times[idx].sum(axis=1)  # [B, 2]
    ratios = (es[:, 0] / ts[:, 0]) / (es[:, 1] / ts[:, 1])
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def mean_ci(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the mean of `values` (one per prompt), resampling them; NaNs
    with fewer than 2."""
    if len(values) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _bootstrap(pairs: list[tuple[dict, dict]], seed: int = 0) -> tuple[float, float]:
    """95% interval of the total speedup over prompts, resampling prompt pairs."""
    e = np.array([[a["summary"]["emitted"], b["summary"]["emitted"]] for a, b in pairs], float)
    t = np.array([[_decode_ms(a["summary"]), _decode_ms(b["summary"])] for a, b in pairs], float)
    return ratio_ci(e, t, seed)


def _figures(records: list[dict], rounds: list[RoundTrace], plain: list[dict]) -> dict[str, Any]:
    s = [r["summary"] for r in records]
    emitted = sum(x["emitted"] for x in s)
    proposed = sum(x["proposed"] for x in s)
    accepted = sum(x["accepted"] for x in s)
    n_rounds = sum(x["rounds"] for x in s)
    draft, verify, over = (sum(x[k] for x in s) for k in ("draft_ms", "verify_ms", "overhead_ms"))
    spent = draft + verify + over
    by_prompt = {(r["prompt_id"], r["repeat"]): r for r in plain}
    pairs = [
        (r, by_prompt[(r["prompt_id"], r["repeat"])])
        for r in records
        if (r["prompt_id"], r["repeat"]) in by_prompt
    ]
    ratios = [_rate([a]) / _rate([b]) for a, b in pairs]
    fig = {
        "requests": len(records),
        "prompts": len({(r["category"], r["prompt_id"]) for r in records}),
        "ttft_ms": float(
            np.median([x["ttft_ms"] for x in s if x["ttft_ms"] is not None] or [math.nan])
        ),
        "continuation_tokens_per_s": float(
            np.median(
                [x["continuation_tokens_per_s"] for x in s if x["continuation_tokens_per_s"]]
                or [math.nan]
            )
        ),
        "total_ms": float(np.median([x["total_ms"] for x in s])),
        "emitted": emitted,
        "rounds": n_rounds,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_accepted_length": emitted / n_rounds if n_rounds else None,
        "alpha_per_position": alpha_per_position(rounds),
        "acceptance_per_position": acceptance_per_position(rounds),
        "rejection_positions": rejection_histogram(rounds),
        "draft_share": draft / spent if spent else None,
        "verify_share": verify / spent if spent else None,
        "overhead_share": over / spent if spent else None,
        "draft_ms_per_round": draft / n_rounds if n_rounds else None,
        "verify_ms_per_round": verify / n_rounds if n_rounds else None,
        "overhead_ms_per_round": over / n_rounds if n_rounds else None,
        "goodput_tokens_per_ms": emitted / spent if spent else None,
        "speedup_total": _rate([a for a, _ in pairs]) / _rate([b for _, b in pairs])
        if pairs
        else None,
        "speedup_e2e": (
            _rate([a for a, _ in pairs], True) / _rate([b for _, b in pairs], True)
            if pairs
            else None
        ),
        "prefill_ms": float(np.median([x["prefill_ms"] for x in s])),
        "draft_prefill_ms": float(np.median([x["draft_prefill_ms"] for x in s])),
        "speedup_median": float(np.median(ratios)) if ratios else None,
        "speedup_ci95": _bootstrap(pairs),
        "peak_rss_mb": max(x["peak_rss_mb"] for x in s),
        "choices": choice_shares(rounds),
        "trees": tree_figures(rounds),
    }
    checks = [r["check"] for r in records]
    if checks and "match" in checks[0]:
        bad = [c for c in checks if not c["match"]]
        fig["greedy_match_rate"] = 1 - len(bad) / len(checks)
        fig["divergences"] = [
            {"position": c["position"], "top2_gap": c["top2_gap"], "near_tie": c["near_tie"]}
            for c in bad
        ]
        fig["equivalence_ok"] = all(c["near_tie"] for c in bad)
    elif checks and "mean_logprob" in checks[0]:
        by_prompt_lp = {(r["prompt_id"], r["repeat"]): r["check"]["mean_logprob"] for r in plain}
        d = [
            r["check"]["mean_logprob"] - by_prompt_lp[(r["prompt_id"], r["repeat"])]
            for r in records
            if (r["prompt_id"], r["repeat"]) in by_prompt_lp
        ]
        d = [x for x in d if not math.isnan(x)]
        mean = float(np.mean(d)) if d else math.nan
        se = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
        z = mean / se if se and se > 0 else 0.0
        fig["logprob_diff"] = {"mean": mean, "se": se, "z": z, "n": len(d)}
        # Too few pairs give no usable noise estimate: then the check is reported, not judged.
        fig["equivalence_ok"] = None if len(d) < SAMPLED_MIN_N else not abs(z) > SAMPLED_Z
    if checks and "passed" in checks[0]:
        fig.update(_pass_at_1(records, plain))
    return fig


def _pass_at_1(records: list[dict], plain: list[dict]) -> dict[str, Any]:
    """pass@1 (the share of answers whose program passed the problem's tests) and its change
    against plain decoding of the same prompts: the mean of paired differences, with a 95%
    bootstrap interval over prompts."""
    passed = {(r["prompt_id"], r["repeat"]): r["check"]["passed"] for r in plain}
    diffs = [
        float(r["check"]["passed"]) - float(passed[(r["prompt_id"], r["repeat"])])
        for r in records
        if (r["prompt_id"], r["repeat"]) in passed
    ]
    return {
        "pass_at_1": float(np.mean([r["check"]["passed"] for r in records])),
        "pass_at_1_delta": {
            "mean": float(np.mean(diffs)) if diffs else math.nan,
            "ci95": mean_ci(np.array(diffs)),
            "n": len(diffs),
        },
    }


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
                if _baseline(by_spec):
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
                if _baseline(by_spec):
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


def against_hindsight(figures: dict) -> dict[str, dict[str, dict]]:
    """For every category and sampling where k=auto ran: auto's speedup, the best fixed
    configuration in hindsight (plain, at 1.0, counts as one), auto over the better of the two,
    and the fixed configurations whose speedup is above auto's."""
    out: dict[str, dict[str, dict]] = {}
    for cat, by_s in figures.items():
        for sampling, by_spec in by_s.items():
            auto = (by_spec.get("auto") or {}).get("speedup_total")
            if auto is None:
                continue
            fixed = {
                s: f["speedup_total"]
                for s, f in by_spec.items()
                if not s.startswith(("auto", "plain")) and f["speedup_total"] is not None
            }
            best = max({"plain": 1.0, **fixed}.items(), key=lambda kv: kv[1])  # first on a tie
            out.setdefault(cat, {})[sampling] = {
                "auto": auto,
                "best_fixed": best[0],
                "best_fixed_speedup": best[1],
                "ratio": auto / best[1],
                "faster_than_auto": sorted(s for s, x in fixed.items() if x > auto),
            }
    return out


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


def _baseline(by_spec: dict[str, dict]) -> str | None:
    """The spec of the `plain on <backend>` baseline among these, if one ran."""
    return next((s for s in by_spec if s.startswith(BASELINE)), None)


def _baseline_line(by_spec: dict[str, dict]) -> str:
    """'over plain on llama_cpp: plain 1.45x, auto 1.60x, ...' (a baseline ran)."""
    base = _baseline(by_spec)
    return f"over {base}: " + ", ".join(
        f"{spec} {_f(f.get('speedup_vs_baseline'))}x" for spec, f in by_spec.items() if spec != base
    )


def _against_baseline(figs: dict[str, dict]) -> None:
    """Where a `plain on <backend>` baseline ran: every configuration's speedup over it (the
    ratio of the two speedups over plain, both paired by prompt)."""
    base = _baseline(figs)
    if base is None or not figs[base]["speedup_total"]:
        return
    for f in figs.values():
        x = f["speedup_total"]
        f["speedup_vs_baseline"] = None if x is None else x / figs[base]["speedup_total"]


def by_request(records: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """Per sampling and configuration, one row per prompt in the order the run met them
    (`index`): the configuration's decode speed over plain's on that prompt and its acceptance
    rate. Shows how a drafter that remembers earlier requests comes to pay as the run goes on."""
    order = {
        p: i for i, p in enumerate(dict.fromkeys((r["category"], r["prompt_id"]) for r in records))
    }
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        groups[(r["sampling"], r["category"], r["prompt_id"])][r["spec"]].append(r)
    out: dict[str, dict[str, list[dict]]] = {}
    for (sampling, cat, pid), by_spec in groups.items():
        plain = by_spec.get("plain")
        if not plain:
            continue
        for spec, recs in by_spec.items():
            if spec == "plain":
                continue
            proposed = sum(r["summary"]["proposed"] for r in recs)
            accepted = sum(r["summary"]["accepted"] for r in recs)
            out.setdefault(sampling, {}).setdefault(spec, []).append(
                {
                    "index": order[(cat, pid)],
                    "prompt_id": pid,
                    "speedup": _rate(recs) / _rate(plain),
                    "acceptance_rate": accepted / proposed if proposed else None,
                }
            )
    for by_spec in out.values():
        for rows in by_spec.values():
            rows.sort(key=lambda row: row["index"])
    return out


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


def _lossy(records: list[dict], rounds_by: dict, plain_by: dict) -> dict:
    """Figures of the lossy configurations, category -> sampling -> spec, each against the
    exact plain run of the same prompts: speed, acceptance, and what the rule changed (the
    target's mean log-probability against plain's, how often and how far it followed its own
    configuration's exact sample)."""
    groups: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        for cat in (rec["category"], "all"):
            groups[(cat, rec["sampling"])][rec["spec"]].append(rec)
    out: dict[str, dict[str, dict]] = {}
    for (cat, sampling), by_spec in groups.items():
        for spec, recs in by_spec.items():
            plain = plain_by.get((cat, sampling), [])
            f = _figures(recs, rounds_by.get((cat, recs[0]["config"]), []), plain)
            f["equivalence_ok"] = None  # not the target's distribution, by design
            f["same_as_exact"] = float(np.mean([r["check"]["same_as_exact"] for r in recs]))
            f["exact_prefix"] = float(np.mean([r["check"]["exact_prefix"] for r in recs]))
            out.setdefault(cat, {}).setdefault(sampling, {})[spec] = f
    return out


def build(records: list[dict], rounds: Iterable[dict], run: dict) -> Report:
    """Aggregate request records and round records into a Report (lossy configurations, apart:
    `Report.lossy`)."""
    fields = set(RoundTrace.__dataclass_fields__)
    rounds_by: dict[tuple, list[RoundTrace]] = defaultdict(list)
    for r in rounds:
        rt = RoundTrace(**{k: v for k, v in r.items() if k in fields})
        rounds_by[(r["category"], r["config"])].append(rt)
        rounds_by[("all", r["config"])].append(rt)
    lossy = [r for r in records if r.get("acceptance", EXACT) != EXACT]
    records = [r for r in records if r.get("acceptance", EXACT) == EXACT]
    groups: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        for cat in (rec["category"], "all"):
            groups[(cat, rec["sampling"])][rec["spec"]].append(rec)
    cats = [*dict.fromkeys(r["category"] for r in records), "all"]
    figures: dict[str, dict[str, dict]] = {}
    recommendation: dict[str, dict] = {}
    for cat in cats:
        for (c, sampling), by_spec in groups.items():
            if c != cat:
                continue
            plain = by_spec.get("plain", [])
            figs = {}
            for spec, recs in by_spec.items():
                key = recs[0]["config"]
                figs[spec] = _figures(recs, rounds_by.get((cat, key), []), plain)
            _against_baseline(figs)
            figures.setdefault(cat, {})[sampling] = figs
            recommendation.setdefault(cat, {})[sampling] = _recommend(figs)
    plain_by = {key: by_spec.get("plain", []) for key, by_spec in groups.items()}
    return Report(
        figures, recommendation, run, by_request(records), _lossy(lossy, rounds_by, plain_by)
    )
