"""What `specwise bench` prints for people: one table per sampling setting, a row per category
(plain decoding's tokens/s, `auto`'s, `auto` over plain with its 95% interval or the number of
prompts where there is none, over the mainline baseline where it ran, acceptance, what
drafted), the other configurations in one line, exactness said as what it is, and one verdict.

Every number is a figure `bench.figures` computed (or the near-tie bound the runner measured,
in the run's settings); this module only lays them out and words them. The per-configuration
detail is `report.md`'s (`bench.report`). A lossless rule's exactness is never a bare
percentage: greedy runs say how many texts were identical and where the others parted (each
divergence's top-2 gap against the near-tie bound), sampled runs the log-probability test.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

from specwise.bench.figures import spec_order
from specwise.bench.runner import BASELINE
from specwise.bench.ties import NEAR_TIE_FACTOR

__all__ = ["fmt", "gap_list", "headline_spec", "pass_text", "text"]

GAPS_SHOWN = 4  # top-2 gaps listed in an exactness line; more are counted
WIDTH = 110  # sentences wrap here (the tables and the verdict line do not)


def fmt(x, spec=".2f", none="-") -> str:
    """A figure as text; `none` for a missing or NaN one."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, spec)


def pass_text(f: dict) -> str:
    """pass@1 and its change against plain ("not measured" where the prompts have no tests)."""
    if "pass_at_1" not in f:
        return "not measured"
    d = f["pass_at_1_delta"]
    lo, hi = d["ci95"]
    return (
        f"{fmt(100 * f['pass_at_1'], '.0f')}% (Δ {fmt(100 * d['mean'], '+.0f')} pts, "
        f"{fmt(100 * lo, '+.0f')} to {fmt(100 * hi, '+.0f')})"
    )


def _wrap(line: str) -> list[str]:
    return textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def headline_spec(figures: dict) -> str | None:
    """The configuration the tables set against plain: `auto` where it ran (what a user gets),
    else the first speculative one in the fixed order; None where only plain ran."""
    specs = {s for by_s in figures.values() for by_spec in by_s.values() for s in by_spec}
    if "auto" in specs:
        return "auto"
    rest = sorted((s for s in specs if s != "plain" and not s.startswith(BASELINE)), key=spec_order)
    return rest[0] if rest else None


def _baseline(by_spec: dict) -> str | None:
    return next((s for s in by_spec if s.startswith(BASELINE)), None)


def _speedup(f: dict) -> str:
    """'1.18x (1.03–1.41)', or '1.21x (1 prompt)' where no interval could be drawn."""
    x = f.get("speedup_total")
    if x is None:
        return "not paired with plain"
    lo, hi = f["speedup_ci95"]
    if math.isnan(lo):
        n = f.get("prompts", 1)
        return f"{x:.2f}x ({n} prompt{'s' if n != 1 else ''})"
    return f"{x:.2f}x ({lo:.2f}–{hi:.2f})"


def _drafted(f: dict) -> str:
    """The drafters' shares of the configuration's rounds, largest first (the rest plain)."""
    if not f.get("choices"):
        return "no rounds recorded"
    shares = sorted(
        ((name, c["share"]) for name, c in (f.get("choices") or {}).items() if name != "plain"),
        key=lambda kv: -kv[1],
    )
    if not shares:
        return "none: plain rounds only"
    return ", ".join(f"{name} {_share(share)}" for name, share in shares[:3])


def _share(x: float) -> str:
    """A share of rounds as a percentage; a drafter that drafted at all never reads 0%."""
    return "<1%" if x < 0.005 else f"{100 * x:.0f}%"


def _columns(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            (cell.rjust(w) if r else cell.ljust(w))
            for cell, w, r in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]


def _table(figures: dict, sampling: str, head: str, base: str | None) -> list[str]:
    cats = [c for c in figures if c != "all" and sampling in figures[c]]
    scopes = [(c, figures[c][sampling]) for c in cats]
    if len(cats) > 1:
        n = figures["all"][sampling].get("plain", {}).get("prompts", 0)
        scopes.append((f"all ({n} prompts)", figures["all"][sampling]))
    header = ["category", "plain", head, f"{head}/plain (95% CI)"]
    header += [f"×{base}"] if base else []
    header += ["acc. rate", "drafted (share of rounds)"]
    rows = [header]
    for name, by_spec in scopes:
        plain, f = by_spec.get("plain") or {}, by_spec.get(head)
        if f is None:
            cells = [name, fmt(plain.get("decode_tokens_per_s"), ".1f", "no plain run")]
            rows.append([*cells, "did not run"] + [""] * (len(header) - 3))
            continue
        row = [
            name,
            fmt(plain.get("decode_tokens_per_s"), ".1f", "no plain run"),
            fmt(f.get("decode_tokens_per_s"), ".1f"),
            _speedup(f),
        ]
        if base:
            over = f.get("speedup_vs_baseline")
            row.append("not run" if over is None else f"{over:.2f}x")
        row += [fmt(f.get("acceptance_rate"), ".2f", "no drafts"), _drafted(f)]
        rows.append(row)
    right = [False, True, True, False] + ([True] if base else []) + [True, False]
    return _columns(rows, right)


def gap_list(divs: list[dict]) -> str:
    """The divergences' top-2 gaps, smallest first: '0.01, 0.03' (the first few)."""
    gaps = sorted(d["top2_gap"] for d in divs)
    shown = ", ".join(fmt(g, ".2f", "past plain's end") for g in gaps[:GAPS_SHOWN])
    return shown + (f" and {len(gaps) - GAPS_SHOWN} more" if len(gaps) > GAPS_SHOWN else "")


def _greedy(scope: dict, head: str, run: dict) -> list[str]:
    """How far the greedy texts are plain's, a line each: the headline configuration's prompts,
    where they parted at near-ties and where beyond one, then every other speculative
    configuration's requests together."""
    f = scope[head]
    n = f["requests"]
    unit = "prompts" if n == f["prompts"] else "requests"
    divs = f.get("divergences", [])
    near = [d for d in divs if d["near_tie"]]
    bad = [d for d in divs if not d["near_tie"]]
    bound = run.get("near_tie_below")
    exact_mode = bound is not None and bound == -math.inf
    lines = [
        f"exactness: {head}'s greedy text identical to plain's on {n - len(divs)} of {n} {unit}"
    ]
    if exact_mode and not divs:
        lines[0] += ", bit for bit (--exact)"
    if near:
        noise = (run.get("numeric_noise") or {}).get("top2_gap")
        limit = (
            f" ≤ {bound:.2f} = {NEAR_TIE_FACTOR:g}× the kernels' noise {noise:.2f}"
            if bound is not None and noise is not None
            else ""
        )
        lines.append(
            f"  {len(near)} parted at a near-tie (top-2 gap {gap_list(near)}{limit}); "
            "--exact gives bit-for-bit"
        )
    if bad:
        where = "--exact allows none" if exact_mode else "above the near-tie bound"
        lines.append(f"  {len(bad)} FAILED: parted at top-2 gap {gap_list(bad)} ({where})")
    others = [
        g
        for s, g in scope.items()
        if s not in ("plain", head) and not s.startswith(BASELINE) and "divergences" in g
    ]
    if others:
        total = sum(g["requests"] for g in others)
        parted = [d for g in others for d in g["divergences"]]
        failed = sum(not d["near_tie"] for d in parted)
        rest = f"  the other configurations: {total - len(parted)} of {total} requests identical"
        if parted:
            rest += f", {len(parted) - failed} parted at near-ties"
            rest += f", {failed} FAILED (beyond a near-tie)" if failed else ""
        lines.append(rest)
    return [w for line in lines for w in _wrap(line)]


def _sampled(scope: dict, head: str) -> list[str]:
    d = scope[head].get("logprob_diff")
    if not d:
        return []
    ok = scope[head].get("equivalence_ok")
    judged = {
        True: "within noise (|z| ≤ 3)",
        False: "|z| > 3: NOT the target's distribution, a FAILURE",
        None: f"{d['n']} prompt{'s' if d['n'] != 1 else ''}, 5 needed to judge",
    }[ok]
    spread = f" ± {d['se']:.3f}, z {d['z']:+.1f}" if not math.isnan(d["se"]) else ""
    return _wrap(
        f"exactness (sampled): target's mean log-prob of {head}'s text minus plain's "
        f"Δ {fmt(d['mean'], '+.3f')}{spread}: {judged}"
    )


def _others(scope: dict, head: str, where: str) -> list[str]:
    others = [
        f"{s} {fmt(f.get('speedup_total'))}x" for s, f in scope.items() if s not in ("plain", head)
    ]
    return _wrap(f"others over plain ({where}): " + ", ".join(others)) if others else []


def _lossy(f: dict) -> str:
    same = fmt(100 * f["same_as_exact"], ".0f")
    return f"{fmt(f['speedup_total'])}x, output as the exact run's in {same}% of requests"


def _verdict(figures: dict, head: str | None, failures: list[str]) -> str:
    """One line: the headline configuration over plain decoding, over all categories, at the
    sampling with the most prompts (with its interval and what it means), over the baseline
    where it ran, and at the other samplings."""
    prefix = (
        "verdict: EQUIVALENCE CHECK FAILED for " + "; ".join(failures) + " (a bug, not noise); "
        if failures
        else "verdict: "
    )
    if head is None:
        return prefix + "only plain decoding ran"
    runs = [(s, by_spec[head]) for s, by_spec in figures.get("all", {}).items() if head in by_spec]
    runs = [(s, f) for s, f in runs if f.get("speedup_total") is not None]
    if not runs:
        return prefix + f"{head} was not paired with plain decoding on any prompt"
    main_s, f = max(runs, key=lambda sf: sf[1]["prompts"])  # the first of the largest
    x, (lo, hi), n = f["speedup_total"], f["speedup_ci95"], f["prompts"]
    base, b = f.get("speedup_vs_baseline"), _baseline(figures["all"][main_s])
    over = f"; {base:.2f}x {b}" if base is not None and b else ""
    if math.isnan(lo):
        said = (
            f"{x:.2f}x plain decoding at {main_s} ({n} prompt{over}): no interval, "
            "run --limit 3 or more to decide"
        )
    else:
        meaning = {lo > 1: "speculation pays here", hi < 1: "plain decoding is faster here"}
        said = (
            f"{x:.2f}x plain decoding at {main_s} (95% CI {lo:.2f}–{hi:.2f} over {n} prompts"
            f"{over}): {meaning.get(True, 'no gain beyond noise')}"
        )
    rest = [f"at {s} {_speedup(g)}" for s, g in runs if s != main_s]
    return prefix + f"{head} {said}" + (f"; {', '.join(rest)}" if rest else "")


def text(figures: dict, lossy: dict, run: dict, failures: list[str]) -> str:
    """The whole of what the bench prints before the report's path."""
    head = headline_spec(figures)
    lines: list[str] = []
    samplings = list(figures.get("all", {}))
    for sampling in samplings if head else []:
        all_s = figures["all"][sampling]
        base = _baseline(all_s)
        cats = [c for c in figures if c != "all" and sampling in figures[c]]
        scope = all_s if len(cats) > 1 else figures[cats[0]][sampling]
        lines.append(
            f"{sampling} · tokens/s of decoding (prompt prefill apart), {head} against plain"
        )
        lines += _table(figures, sampling, head, base)
        if head in scope:
            lines += _greedy(scope, head, run) if "divergences" in scope[head] else []
            lines += _sampled(scope, head)
        lines += _others(scope, head, "all categories" if len(cats) > 1 else cats[0])
        for c in cats:
            passed = [
                f"{s} {pass_text(f)}" for s, f in figures[c][sampling].items() if "pass_at_1" in f
            ]
            lines += [f"pass@1 {c}: " + "; ".join(passed)] if passed else []
        lost = (lossy.get("all") or {}).get(sampling, {})
        if lost:
            lines += _wrap(
                "LOSSY rules, not the target's distribution (apart from every figure above): "
                + ", ".join(f"{s} {_lossy(f)}" for s, f in lost.items())
            )
        lines.append("")
    if head:
        lines += _wrap(
            "acc. rate = Σ accepted / Σ proposed; drafted = share of rounds by drafter (the rest "
            "plain); each configuration in detail: report.md"
        )
    lines.append(_verdict(figures, head, failures))
    return "\n".join(lines)
