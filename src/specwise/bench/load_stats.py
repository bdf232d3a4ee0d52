"""A load run's statistics (`bench.load`'s, and through it `bench engines`'): what a level and a
setting are (`Level`, `Setting`), what a request must meet (`Slo`), and from the requests'
records, per level and setting (`level_stats`): latency, TTFT and time-per-output-token
percentiles, aggregate throughput (completion tokens over the level's wall time; with several
rounds, all tokens over all wall time, the per-round throughputs kept), steady throughput and
errors; each setting's throughput over the last setting's, level by level
(`throughput_ratios`); and where an open loop's SLO breaks (`slo_breaks`).

Steady throughput (streaming only) counts the tokens received while every worker had a request
in flight, after the start-up — from the moment the first `concurrency` requests all had their
first token to the moment the first request ends after the last one was sent — over that time.
A run of N requests starts with all its first prefills at once and ends with its last requests
finishing alone, at lower concurrency; how long that tail lasts depends on how far the requests
drifted apart, not on the server's speed at the tested concurrency.
Every streaming level also measures a service-level objective (`Slo`: TTFT and time per output
token after the first): the share of requests that met it (a failed request did not) and the
goodput, requests that met it per second of the level; per setting, the highest rate whose
share still reached the objective's target and the first that did not (where the SLO breaks).

Arithmetic on the records only: it sends no request and writes nothing (`bench.load` runs the
levels, and writes the records, the table and the plots).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Level", "Setting", "Slo", "fmt", "level_stats", "slo_breaks", "throughput_ratios"]


@dataclass(frozen=True)
class Slo:
    """What a request must meet to count as served well: its first token within `ttft_s`, the
    rest at most `tpot_s` apart on average; a level holds the SLO while at least `target` of
    its requests meet it."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2
    target: float = 0.9

    def met(self, r: dict[str, Any]) -> bool:
        if "error" in r or r.get("ttft_s") is None or r["ttft_s"] > self.ttft_s:
            return False
        return r.get("tpot_s") is None or r["tpot_s"] <= self.tpot_s


@dataclass(frozen=True)
class Level:
    """A closed-loop level (`concurrency` workers, each sending its next request when its last
    ends) or an open-loop one (Poisson arrivals at `rate` requests per second)."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"{self.rate:g}/s" if self.rate is not None else str(self.concurrency)


@dataclass(frozen=True)
class Setting:
    """One server and one `speculative.k` (None: none sent); `name` when several servers run."""

    url: str
    k: int | str | None
    name: str = ""
    api_key: str | None = None  # this setting's, if not the options' (a tenant of its own)

    @property
    def label(self) -> str:
        if self.k is None:
            return self.name or "server default"
        return f"{self.name} k={self.k}" if self.name else f"k={self.k}"


def _tokens_by(progress: list[tuple[float, float]], t: float) -> float:
    """Completion tokens a request had received by time t."""
    i = bisect.bisect_right([p for p, _ in progress], t)
    return progress[i - 1][1] if i else 0.0


def _steady(results: list[dict[str, Any]], concurrency: int) -> tuple[float, float] | None:
    """(tokens, seconds) of a run in its steady state, every worker with a request in flight
    (a worker sends its next request as soon as the last one ends): from the moment the first
    `concurrency` requests all had their first token (the start-up, all their prefills at once,
    is over) to the first request to end after the last one was sent (the tail begins). None
    when the run had no such time (too few requests), a request failed, or they did not stream
    (no times of tokens)."""
    if len(results) < concurrency or any(r.get("progress") is None for r in results):
        return None
    by_sent = sorted(results, key=lambda r: r["sent"])
    if any(r["first"] is None for r in by_sent[:concurrency]):
        return None
    a = max(r["first"] for r in by_sent[:concurrency])
    b = min(r["end"] for r in results if r["end"] > by_sent[-1]["sent"])
    if b <= a:
        return None
    tokens = sum(_tokens_by(r["progress"], b) - _tokens_by(r["progress"], a) for r in results)
    return tokens, b - a


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def level_stats(
    level: Level,
    setting: Setting,
    runs: list[tuple[list[dict[str, Any]], float]],
    slo: Slo,
    stream: bool,
) -> dict:
    """A level's statistics over its runs."""
    results = [r for rs, _ in runs for r in rs]
    ok = [r for r in results if "error" not in r]
    lat = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    cont = [r["continuation_tps"] for r in ok if r["continuation_tps"] is not None]
    wall = sum(w for _, w in runs)
    steady = (
        [None] if level.concurrency is None else [_steady(rs, level.concurrency) for rs, _ in runs]
    )
    if None in steady:
        steady_tps, steady_by_round = None, None
    else:
        steady_tps = sum(n for n, _ in steady) / sum(t for _, t in steady)
        steady_by_round = [n / t for n, t in steady]
    met = [r for r in results if slo.met(r)] if stream else None
    return {
        "level": level.label,
        "concurrency": level.concurrency,
        "rate": level.rate,
        "setting": setting.label,
        "server": setting.name,
        "k": setting.k,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_kinds": sorted({r["error"] for r in results if "error" in r}),
        "throughput_tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "throughput_by_round": [
            sum(r["tokens"] for r in rs if "error" not in r) / w for rs, w in runs
        ],
        "steady_tokens_per_s": steady_tps,
        "steady_by_round": steady_by_round,
        "latency_s": {"p50": _pct(lat, 50), "p90": _pct(lat, 90), "p99": _pct(lat, 99)},
        "ttft_s": {"p50": _pct(ttft, 50), "p90": _pct(ttft, 90), "p99": _pct(ttft, 99)},
        "tpot_s": {"p50": _pct(tpot, 50), "p90": _pct(tpot, 90), "p99": _pct(tpot, 99)},
        "continuation_tokens_per_s": {"p50": _pct(cont, 50), "p10": _pct(cont, 10)},
        "slo_met": None if met is None else len(met) / len(results),
        "goodput_requests_per_s": None if met is None else len(met) / wall,
        "goodput_tokens_per_s": None if met is None else sum(r["tokens"] for r in met) / wall,
        "wall_s": wall,
    }


def slo_breaks(levels: list[dict], slo: Slo) -> list[dict]:
    """Per setting of an open-loop run: the highest rate (of those run, in order) up to which
    every level met the SLO's target share, and the first rate at which one did not (None:
    held at every rate run)."""
    out = []
    for setting in dict.fromkeys(lv["setting"] for lv in levels):
        held = breaks = None
        for lv in sorted((x for x in levels if x["setting"] == setting), key=lambda x: x["rate"]):
            if lv["slo_met"] is not None and lv["slo_met"] >= slo.target:
                held = lv["rate"]
                continue
            breaks = lv["rate"]
            break
        out.append({"setting": setting, "holds_up_to": held, "breaks_at": breaks})
    return out


def _over(xs: list[float], ys: list[float]) -> list[float]:
    """Round by round, x / y."""
    return [x / y for x, y in zip(xs, ys, strict=True)]


def throughput_ratios(levels: list[dict]) -> list[dict]:
    """Each setting's throughput over the last setting's, level by level: pooled and by round."""
    out = []
    for c in dict.fromkeys(lv["level"] for lv in levels):
        at = [lv for lv in levels if lv["level"] == c]
        base = at[-1]
        for lv in at[:-1]:
            by_round = _over(lv["throughput_by_round"], base["throughput_by_round"])
            pooled = lv["throughput_tokens_per_s"] / base["throughput_tokens_per_s"]
            steady = steady_by_round = None
            if lv["steady_tokens_per_s"] and base["steady_tokens_per_s"]:
                steady = lv["steady_tokens_per_s"] / base["steady_tokens_per_s"]
                steady_by_round = _over(lv["steady_by_round"], base["steady_by_round"])
            goodput = None
            if lv["goodput_tokens_per_s"] is not None and base["goodput_tokens_per_s"]:
                goodput = lv["goodput_tokens_per_s"] / base["goodput_tokens_per_s"]
            out.append(
                {
                    "level": c,
                    "setting": lv["setting"],
                    "vs": base["setting"],
                    "pooled": pooled,
                    "by_round": by_round,
                    "steady": steady,
                    "steady_by_round": steady_by_round,
                    "goodput": goodput,
                }
            )
    return out


def fmt(x, spec=".2f") -> str:
    """A figure for a table: x formatted by `spec`, "-" where it is None."""
    return "-" if x is None else format(x, spec)
