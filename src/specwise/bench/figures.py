"""The bench's figures per (category, sampling, configuration), from its records.

Every figure is computed by `specwise.trace` from the recorded rounds, or from the requests'
summaries; this module adds only comparisons against plain decoding on the same prompts:

- speedup: (Σ emitted / Σ decode ms) of the configuration over plain's, where decode ms is
  a request's total time minus the target's prompt prefill — the prefill is the same work for
  every configuration and, on a shared machine, the noisiest part; a draft model's own prefill
  stays in (it is a cost of speculating);
- speedup (median): the median over prompts of the per-prompt ratio of the same rates;
- e2e speedup: the same with total time (prefill included), what a user waits for;
- a 95% bootstrap interval of the speedup over prompts (`ratio_ci`);
- against a `plain on <backend>` baseline, where one ran: each speedup over the baseline's;
- k=auto against hindsight: auto's speedup over the better of plain and the best *fixed*
  configuration of that category and sampling, chosen after the fact (the controller's bar);
- per prompt, in the order run (`by_request`); pass@1 and its change, where the prompts have
  tests; the lossy configurations' figures apart (`lossy_figures`), never among the others.

Acceptance figures are per configuration, i.e. at one k, and say so. What this is not: the
recommendation or any text (`bench.report` decides the one and writes the other); it reads
records it is given and writes nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from specwise.bench.runner import BASELINE, LOSSY
from specwise.lossy import EXACT
from specwise.trace import (
    RoundTrace,
    acceptance_per_position,
    alpha_per_position,
    choice_shares,
    offer_figures,
    rejection_histogram,
    tree_figures,
    verify_figures,
)

__all__ = [
    "against_baseline",
    "against_hindsight",
    "aggregate",
    "baseline",
    "by_request",
    "figures_of",
    "lossy_figures",
    "mean_ci",
    "ratio_ci",
    "spec_order",
]

BOOTSTRAP = 2000
SAMPLED_Z = 3.0  # |z| above this flags a sampled configuration's distribution
SAMPLED_MIN_N = 5  # prompt pairs needed before a sampled check can flag anything


def spec_order(spec: str) -> tuple:
    """Where a configuration stands in every table, whatever order the run met it in: plain,
    the baseline (`plain on <backend>`), auto, the other auto sets, then the fixed ones by
    drafter and k; a lossy rule right after its exact configuration."""
    exact, _, rule = spec.partition(LOSSY)
    drafter, _, k = exact.partition(" k=")
    if exact == "plain":
        rank = 0
    elif exact.startswith(BASELINE):
        rank = 1
    elif exact == "auto":
        rank = 2
    elif exact.startswith("auto["):
        rank = 3
    else:
        rank = 4
    return (rank, drafter, int(k) if k.isdigit() else 0, rule)


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


def figures_of(records: list[dict], rounds: list[RoundTrace], plain: list[dict]) -> dict[str, Any]:
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
        "decode_tokens_per_s": 1000 * _rate(records),  # what `speedup_total` is a ratio of
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
        "offers": offer_figures(rounds),
        "verify": verify_figures(rounds),
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


def baseline(by_spec: dict[str, dict]) -> str | None:
    """The spec of the `plain on <backend>` baseline among these, if one ran."""
    return next((s for s in by_spec if s.startswith(BASELINE)), None)


def against_baseline(figs: dict[str, dict]) -> None:
    """Where a `plain on <backend>` baseline ran: every configuration's speedup over it (the
    ratio of the two speedups over plain, both paired by prompt)."""
    base = baseline(figs)
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
    return {
        sampling: dict(sorted(by_spec.items(), key=lambda kv: spec_order(kv[0])))
        for sampling, by_spec in out.items()
    }


def lossy_figures(records: list[dict], rounds_by: dict, plain_by: dict) -> dict:
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
        for spec, recs in sorted(by_spec.items(), key=lambda kv: spec_order(kv[0])):
            plain = plain_by.get((cat, sampling), [])
            f = figures_of(recs, rounds_by.get((cat, recs[0]["config"]), []), plain)
            f["equivalence_ok"] = None  # not the target's distribution, by design
            f["same_as_exact"] = float(np.mean([r["check"]["same_as_exact"] for r in recs]))
            f["exact_prefix"] = float(np.mean([r["check"]["exact_prefix"] for r in recs]))
            out.setdefault(cat, {}).setdefault(sampling, {})[spec] = f
    return out


def aggregate(records: list[dict], rounds: Iterable[dict]) -> tuple[dict, dict, dict]:
    """Request records and round records aggregated: the figures, category -> sampling -> spec
    with "all" over the categories (each configuration against the baseline where one ran);
    the rows per prompt (`by_request`); and the lossy configurations' figures, apart."""
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
    for cat in cats:
        for (c, sampling), by_spec in groups.items():
            if c != cat:
                continue
            plain = by_spec.get("plain", [])
            figs = {}
            for spec, recs in sorted(by_spec.items(), key=lambda kv: spec_order(kv[0])):
                key = recs[0]["config"]
                figs[spec] = figures_of(recs, rounds_by.get((cat, key), []), plain)
            against_baseline(figs)
            figures.setdefault(cat, {})[sampling] = figs
    plain_by = {key: by_spec.get("plain", []) for key, by_spec in groups.items()}
    return figures, by_request(records), lossy_figures(lossy, rounds_by, plain_by)
