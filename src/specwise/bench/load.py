"""`specwise bench load`: a load generator for any OpenAI-compatible server.

For each concurrency level (and each speculation setting, when the server is specwise), N chat
requests run with that many in flight. Per request: TTFT (streaming only: time to the first
content chunk), continuation tokens/s after the first token, end-to-end latency; per level:
latency percentiles, aggregate throughput (completion tokens over the level's wall time), steady
throughput and errors. Steady throughput (streaming only) counts the tokens received while every
worker had a request in flight, after the start-up — from the moment the first `concurrency`
requests all had their first token to the moment the first request ends after the last one was
sent — over that time. A run of N requests starts with all its first prefills at once and ends
with its last requests finishing alone, at lower concurrency; how long that tail lasts depends
on how far the requests drifted apart, not on the server's speed at the tested concurrency.
Token times come from the usage a chunk carries when the server sends one with every chunk
(`stream_options.continuous_usage_stats`, as specwise and vLLM do), else from counting chunks.
Every request's record (times from its run's start) goes to `requests.jsonl` in the output
folder, the level statistics to `load.json`. Settings of one level run back to back, so their
numbers are side by side; with `rounds` > 1 each level runs its settings that many times, in
reversed order every other round (A B, B A, ...), so drift of the machine weighs on every
setting alike, and the statistics pool all rounds (throughput: all tokens over all wall time;
per-round throughputs kept). Each round of each level sends the next N prompts of the list
(wrapping round only once the list is used up: a server that caches prompts, or a drafter that
remembers earlier answers, would otherwise meet the same request again in the next level),
the same ones for every setting of the round; the CLI lists the prompts a category at a time in
turn, so that any N of them mix the categories. With several settings, each is compared with
the last one (e.g. `--k auto,0`: auto / 0) level by level. Several servers (e.g. one per
backend) make settings together with the k values: server by server, every k; each level runs
them all side by side, and the last (e.g. the mainline server's k=0) is the baseline.
Open loop (`rates`): a level is instead an arrival rate: requests arrive at the times of a
Poisson process (exponential gaps, seeded by the round, the same for every setting of the
round) whether or not earlier ones have finished, as users do; a closed loop slows its own
arrivals when the server slows, which flatters a slow setting. Every streaming level also
measures a service-level objective (`Slo`: TTFT and time per output token after the first):
the share of requests that met it (a failed request did not) and the goodput, requests that
met it per second of the level; per setting, the highest rate whose share still reached the
objective's target and the first that did not (where the SLO breaks).
Given `counters` (a reader of a server's speculative counters, `engines.counters`), each run
reads them before and after, and every level gets the acceptance figures of what its runs
counted (`speculation`); `bench engines` reads every engine's this way.
A soak (`run_soak`) instead keeps one level busy for a given time and samples the server's
/health as it goes (does its memory stay bounded?).
Talks HTTP only; it knows nothing of specwise's internals.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from specwise.bench.ties import NEAR_TIE_FACTOR, alone_check, near_ties

if TYPE_CHECKING:
    from specwise.engines.counters import Counters

__all__ = ["Level", "LoadOptions", "Slo", "one_request", "run_load", "run_soak", "server_client"]


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


@dataclass
class LoadOptions:
    urls: dict[str, str]  # name -> base URL; one server: {"": url}
    concurrency: list[int]
    prompts: list[str]
    ks: list[int | str | None]  # None: send no `speculative` field (any server)
    out: Path
    model: str | None = None
    requests: int = 16
    stream: bool = True
    max_tokens: int = 128
    api_key: str | None = None
    timeout_s: float = 600.0
    rounds: int = 1
    rates: list[float] = field(default_factory=list)  # open loop when given (requests/s)
    logprobs: bool = False  # ask each token's log-probability and top 2 (`alone_check`)
    slo: Slo = field(default_factory=Slo)
    seed: int = 0  # of the open loop's arrival times
    only: list[Setting] | None = None  # these settings instead of every server with every k
    # a server's speculative counters now (`engines.counters`), read before and after each run
    counters: Callable[[str], Counters | None] | None = None

    def levels(self) -> list[Level]:
        if self.rates:
            return [Level(rate=r) for r in self.rates]
        return [Level(concurrency=c) for c in self.concurrency]

    def settings(self) -> list[Setting]:
        """`only`, else every server with every k, in that order."""
        if self.only is not None:
            return list(self.only)
        return [Setting(url, k, name) for name, url in self.urls.items() for k in self.ks]


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


def one_request(client: httpx.Client, opts: LoadOptions, prompt: str, k) -> dict[str, Any]:
    """One greedy chat request with `prompt` and `speculative.k` = k (None: not sent): its
    times (TTFT when streaming: to the first content chunk), tokens and progress, or its
    error."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": opts.max_tokens,
        "temperature": 0.0,
        "stream": opts.stream,
    }
    if opts.model:
        body["model"] = opts.model
    if opts.stream:  # usage in every chunk where the server can (vLLM's extension; specwise)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if k is not None:
        body["speculative"] = {"k": k}
    if opts.logprobs:
        body |= {"logprobs": True, "top_logprobs": 2}
    t0 = time.perf_counter()
    first = None
    tokens = chunks = 0
    prompt_tokens = None
    logprobs: list[dict] = []  # the answer's tokens: {token, logprob, top_logprobs}
    timeline: list[tuple[float, int | None]] = []  # (time, completion tokens so far) by chunk
    try:
        if not opts.stream:
            r = client.post("/chat/completions", json=body)
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}", "latency_s": time.perf_counter() - t0}
            answer = r.json()
            tokens = answer.get("usage", {}).get("completion_tokens", 0)
            prompt_tokens = answer.get("usage", {}).get("prompt_tokens")
            for ch in answer.get("choices", []):
                logprobs += (ch.get("logprobs") or {}).get("content") or []
        else:
            with client.stream("POST", "/chat/completions", json=body) as r:
                if r.status_code != 200:
                    return {"error": f"HTTP {r.status_code}", "latency_s": time.perf_counter() - t0}
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    obj = json.loads(line[6:])
                    if obj.get("usage"):
                        tokens = obj["usage"].get("completion_tokens", tokens)
                        prompt_tokens = obj["usage"].get("prompt_tokens", prompt_tokens)
                    for ch in obj.get("choices", []):
                        logprobs += (ch.get("logprobs") or {}).get("content") or []
                        if (ch.get("delta") or {}).get("content"):
                            chunks += 1
                            now = time.perf_counter()
                            first = first or now
                            timeline.append(
                                (now, (obj.get("usage") or {}).get("completion_tokens"))
                            )
    except httpx.HTTPError as exc:
        return {"error": type(exc).__name__, "latency_s": time.perf_counter() - t0}
    end = time.perf_counter()
    tokens = tokens or chunks
    out = {
        "sent": t0,
        "first": first,
        "end": end,
        "latency_s": end - t0,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "ttft_s": None,
        "tpot_s": None,
        "continuation_tps": None,
        "progress": _progress(timeline, tokens, end) if opts.stream else None,
    }
    if opts.logprobs:
        out["logprobs"] = logprobs
    if first is not None:
        out["ttft_s"] = first - t0
        if tokens > 1 and end > first:
            out["continuation_tps"] = (tokens - 1) / (end - first)
            out["tpot_s"] = (end - first) / (tokens - 1)
    return out


def _progress(
    timeline: list[tuple[float, int | None]], tokens: int, end: float
) -> list[tuple[float, float]]:
    """(time, completion tokens so far) of a request: the server's count at each chunk where it
    sent one, else the chunks so far scaled to the final count; all tokens by `end`."""
    if timeline and all(n is not None for _, n in timeline):
        points = [(t, float(n)) for t, n in timeline]
    else:
        points = [(t, tokens * (i + 1) / len(timeline)) for i, (t, _) in enumerate(timeline)]
    return [*points, (end, float(tokens))]


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


def server_client(
    url: str, opts: LoadOptions, api: bool = True, api_key: str | None = None
) -> httpx.Client:
    """A client of the server's OpenAI routes (`api`, under /v1) or of its root (/health),
    with `api_key`, else the options' key. Every request opens its own connection: a
    kept-alive one that the server has just closed (llama-server does, after some streamed
    answers) fails the next request at once."""
    key = api_key or opts.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base = url.rstrip("/").removesuffix("/v1")
    return httpx.Client(
        base_url=base + "/v1" if api else base,
        headers=headers,
        timeout=opts.timeout_s,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def _run(
    opts: LoadOptions, level: Level, setting: Setting, first: int = 0, round_: int = 0
) -> tuple[list[dict[str, Any]], float]:
    """One run of a level, with the prompts from `first` on (wrapping round): (per-request
    results, wall seconds). Open loop: request i is sent at its arrival time (`arrival`, from
    the run's start), on a thread of its own."""
    picks = [(first + i) % len(opts.prompts) for i in range(opts.requests)]
    arrivals = [0.0] * len(picks)
    if level.rate is not None:
        rng = np.random.default_rng([opts.seed, round_])
        arrivals = np.cumsum(rng.exponential(1.0 / level.rate, size=len(picks))).tolist()
    workers = len(picks) if level.rate is not None else level.concurrency
    client = server_client(setting.url, opts, api_key=setting.api_key)
    with client, ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()

        def send(i: int) -> dict[str, Any]:
            time.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
            return one_request(client, opts, opts.prompts[picks[i]], setting.k)

        results = list(pool.map(send, range(len(picks))))
        wall = time.perf_counter() - t0
    for p, at, r in zip(picks, arrivals, results, strict=True):  # times from the run's start
        r["prompt"] = p
        if level.rate is not None:
            r["arrival"] = at
        for key in ("sent", "first", "end"):
            if r.get(key) is not None:
                r[key] -= t0
        if r.get("progress"):
            r["progress"] = [(t - t0, n) for t, n in r["progress"]]
    return results, wall


def _level(
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


def _ratios(levels: list[dict]) -> list[dict]:
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


def _plots(levels: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    open_loop = levels[0]["rate"] is not None
    x_key = "rate" if open_loop else "concurrency"
    paths = []
    for key, ylabel, fname in (
        ("throughput_tokens_per_s", "aggregate tokens/s", "throughput.png"),
        ("latency_s", "p50 latency (s)", "latency.png"),
        ("ttft_s", "p50 TTFT (s)", "ttft.png"),
        ("goodput_requests_per_s", "goodput (requests meeting the SLO / s)", "goodput.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for label in dict.fromkeys(lv["setting"] for lv in levels):
            pts = [
                (lv[x_key], lv[key]["p50"] if isinstance(lv[key], dict) else lv[key])
                for lv in levels
                if lv["setting"] == label
            ]
            pts = [p for p in pts if p[1] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("arrivals per second (Poisson)" if open_loop else "concurrent requests")
        ax.set_ylabel(ylabel)
        if not open_loop:
            ax.set_xscale("log", base=2)
        if ax.lines:  # none where nothing was measured (TTFT without --stream)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=90)
        plt.close(fig)
        paths.append(out / fname)
    return paths


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _table(opts: LoadOptions, levels: list[dict], ratios: list[dict]) -> list[str]:
    """The report's lines: a row per level and setting, the ratios to the baseline, and for an
    open loop where the SLO breaks."""
    width = max(len(lv["setting"]) for lv in levels)
    slo = opts.slo
    lines = [
        f"{'rate' if opts.rates else 'conc':>6} {'setting':>{width}} {'tok/s':>8} {'steady':>8} "
        f"{'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'TTFT p50':>8} {'TTFT p90':>8} "
        f"{'TPOT p50':>8} {'SLO met':>7} {'goodput':>7} {'errors':>6}"
    ]
    for lv in levels:
        met = "-" if lv["slo_met"] is None else f"{100 * lv['slo_met']:.0f}%"
        lines.append(
            f"{lv['level']:>6} {lv['setting']:>{width}} "
            f"{lv['throughput_tokens_per_s']:8.2f} {_fmt(lv['steady_tokens_per_s']):>8} "
            f"{_fmt(lv['latency_s']['p50']):>7} "
            f"{_fmt(lv['latency_s']['p90']):>7} {_fmt(lv['latency_s']['p99']):>7} "
            f"{_fmt(lv['ttft_s']['p50']):>8} {_fmt(lv['ttft_s']['p90']):>8} "
            f"{_fmt(lv['tpot_s']['p50'], '.3f'):>8} {met:>7} "
            f"{_fmt(lv['goodput_requests_per_s'], '.3f'):>7} {lv['errors']:>6}"
        )
    if opts.stream:
        lines += [
            "",
            f"SLO: TTFT <= {slo.ttft_s:g} s and time per output token <= {slo.tpot_s:g} s; "
            f"goodput: requests meeting it per second; a level holds it with >= "
            f"{100 * slo.target:.0f}% met",
        ]
    if ratios:
        lines += ["", f"throughput ratios ({opts.rounds} round(s) a level, pooled; by round)"]
    for q in ratios:
        rounds = ", ".join(f"{x:.2f}" for x in q["by_round"])
        name = f"rate {q['level']}" if opts.rates else f"concurrency {q['level']:>3}"
        line = f"{name}: {q['setting']} / {q['vs']} = {q['pooled']:.3f} ({rounds})"
        if q["steady"] is not None:
            rounds = ", ".join(f"{x:.2f}" for x in q["steady_by_round"])
            line += f"; steady {q['steady']:.3f} ({rounds})"
        if q["goodput"] is not None:
            line += f"; goodput (tokens of requests meeting the SLO) {q['goodput']:.3f}"
        lines.append(line)
    if opts.rates and opts.stream:
        lines.append("")
        for b in slo_breaks(levels, slo):
            held, breaks = b["holds_up_to"], b["breaks_at"]
            if breaks is None:
                lines.append(f"{b['setting']}: SLO held at every rate run (up to {held:g}/s)")
            elif held is None:
                lines.append(f"{b['setting']}: SLO broken already at {breaks:g}/s")
            else:
                lines.append(f"{b['setting']}: SLO held up to {held:g}/s; breaks at {breaks:g}/s")
    return lines


def run_load(opts: LoadOptions, stream=None, json_line: bool = True) -> list[dict]:
    """Every level with every setting (module docstring): prints the table, the report's path
    and (`json_line`) the whole result as one JSON line; writes load.json, report.md,
    requests.jsonl and the plots into `opts.out`. Returns the levels' statistics (with
    `speculation`, the figures of the server's counters, where `opts.counters` reads some)."""
    from tqdm import tqdm

    stream = stream or sys.stdout
    opts.out.mkdir(parents=True, exist_ok=True)
    settings = opts.settings()
    runs: dict[tuple[Level, Setting], list] = {
        (lv, x): [] for lv in opts.levels() for x in settings
    }
    counted: dict[tuple[Level, Setting], list[Counters | None]] = {}
    with (
        tqdm(total=len(runs) * opts.rounds, desc="load", unit="run", file=sys.stderr) as bar,
        (opts.out / "requests.jsonl").open("w") as log,
    ):
        for n, level in enumerate(opts.levels()):
            for i in range(opts.rounds):
                first = (n * opts.rounds + i) * opts.requests  # prompts no earlier run sent
                for x in settings if i % 2 == 0 else settings[::-1]:
                    name = "rate" if level.rate is not None else "concurrency"
                    bar.set_postfix_str(f"{name} {level.label} {x.label} round {i + 1}")
                    before = opts.counters(x.url) if opts.counters else None
                    results, wall = _run(opts, level, x, first=first, round_=i)
                    runs[(level, x)].append((results, wall))
                    if opts.counters:  # what this run counted (None: nothing to read)
                        after = opts.counters(x.url)  # (before: None where nothing had counted)
                        run = after.minus(before) if before and after else after
                        counted.setdefault((level, x), []).append(run)
                    for j, r in enumerate(results):
                        row = {"level": level.label, "concurrency": level.concurrency}
                        row |= {"rate": level.rate, "server": x.name, "k": x.k, "round": i + 1}
                        row = {**row, "request": j, **r}
                        log.write(json.dumps(row, separators=(",", ":")) + "\n")
                    log.flush()
                    bar.update(1)
    levels = [_level(lv, x, rs, opts.slo, opts.stream) for (lv, x), rs in runs.items()]
    for lv, key in zip(levels, runs, strict=True):  # the counts of all its runs together
        c = counted.get(key) or [None]
        total = None if None in c else functools.reduce(lambda a, b: a.plus(b), c)
        lv["speculation"] = total.figures() if total is not None and total.drafts else None
    ratios = _ratios(levels)
    table = "\n".join(_table(opts, levels, ratios))
    result = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "urls": opts.urls,
        "max_tokens": opts.max_tokens,
        "stream": opts.stream,
        "rounds": opts.rounds,
        "open_loop": bool(opts.rates),
        "seed": opts.seed,
        "slo": {"ttft_s": opts.slo.ttft_s, "tpot_s": opts.slo.tpot_s, "target": opts.slo.target},
        "levels": levels,
        "ratios": ratios,
        "slo_breaks": slo_breaks(levels, opts.slo) if opts.rates and opts.stream else None,
    }
    (opts.out / "load.json").write_text(json.dumps(result, indent=1))
    (opts.out / "report.md").write_text(
        f"# specwise load report\n\nCommand: `{result['command']}`\n\n```\n{table}\n```\n"
    )
    plots = _plots(levels, opts.out)
    print(table, file=stream)
    print(
        f"\nreport: {opts.out / 'report.md'} (plots: {', '.join(p.name for p in plots)})",
        file=stream,
    )
    if json_line:
        print(json.dumps(result, separators=(",", ":")), file=stream)
    return levels


def _health(client: httpx.Client) -> dict[str, float]:
    """The numbers the server's /health reports now (none where it has no /health)."""
    try:
        r = client.get("/health")
        body = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        body = {}
    return {
        key: v for key, v in body.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def soak_table(samples: list[dict]) -> list[str]:
    """A markdown table of a soak's samples: time, requests so far, and /health's numbers."""
    fields = list(dict.fromkeys(key for s in samples for key in s["health"]))
    out = [
        "| minutes | answered | failed | " + " | ".join(fields) + " |",
        "|---" * (3 + len(fields)) + "|",
    ]
    for s in samples:
        values = [_fmt(s["health"].get(key), "g") for key in fields]
        out.append(
            f"| {s['seconds'] / 60:.1f} | {s['answered']} | {s['failed']} | "
            + " | ".join(values)
            + " |"
        )
    return out


ALONE_PROMPTS = 12  # prompts whose soak answers are checked against the prompt alone
RETRY_AFTER_S = 1.0  # a soak worker's wait after a 429 (specwise's Retry-After)
# a fault that must be answered waits this many times the longest of the load's RECENT latencies
PATIENCE_FACTOR, RECENT = 1.5, 32


def run_soak(
    opts: LoadOptions,
    seconds: float,
    every: float,
    stream=None,
    fault_every: float | None = None,
    alone: bool = False,
) -> dict:
    """Load without pause for `seconds`: `opts.concurrency[0]` workers each send the next
    prompt (wrapping round) as soon as their last request ends, with the first setting (the
    first server, `opts.ks[0]`).
    Every `every` seconds, and once more when the last request has ended, a sample: the time,
    the requests answered and failed so far, and the numbers the server's /health reports
    (a specwise server: its resident memory, the sequences holding cache, the size of the
    suffix drafter's memory).
    fault_every: also one fault of `bench.faults` (picked at random, seeded) every so many
    seconds, beside the load; one that must be answered waits PATIENCE_FACTOR x the longest
    latency of the load's last RECENT requests (at least `faults.REQUEST_S`), since it queues
    behind them; so the first fault waits until as many answers as workers have come (the
    first answers of a server with fewer slots than workers never queued, and a patience
    scaled from them alone timed the first faults out). alone: once the soak is over, run
    each of the first ALONE_PROMPTS prompts alone (the server idle) and compare the soak's greedy answers to
    them with it (`alone_check`, `near_ties`; answers carry their log-probabilities).
    Returns the soak's result: the samples, the faults' outcomes, and `checks`, each criterion
    with what was measured and whether it passed: no 5xx, every fault taken as required,
    nothing left running or holding cache once idle, resident memory grown < 5% after the
    first quarter, greedy answers as alone but at near-ties. Requests go to requests.jsonl,
    the result to soak.json and soak.md."""
    import random

    from tqdm import tqdm

    from specwise.bench.faults import FAULTS, REQUEST_S, run_faults

    stream = stream or sys.stdout
    opts.out.mkdir(parents=True, exist_ok=True)
    opts.logprobs = opts.logprobs or alone
    workers, setting = opts.concurrency[0], opts.settings()[0]
    picks = itertools.count()
    counts = {"answered": 0, "failed": 0}
    lock = threading.Lock()
    errors: dict[str, int] = {}
    checks: list[dict] = []
    faults: list[dict] = []
    answers: dict[int, list[list[dict]]] = {}  # prompt -> its greedy answers' entries
    recent: collections.deque[float] = collections.deque(maxlen=RECENT)  # latencies, seconds
    t0 = time.perf_counter()
    done = threading.Event()

    def work(client: httpx.Client, log) -> None:
        while time.perf_counter() - t0 < seconds:
            p = next(picks) % len(opts.prompts)
            r = one_request(client, opts, opts.prompts[p], setting.k)
            r.pop("progress", None)
            got = r.pop("logprobs", None)
            with lock:
                counts["failed" if "error" in r else "answered"] += 1
                if "error" not in r:
                    recent.append(r["latency_s"])
                if "error" in r:
                    errors[r["error"]] = errors.get(r["error"], 0) + 1
                elif alone and p < ALONE_PROMPTS and got is not None:
                    answers.setdefault(p, []).append(got)
                row = {"prompt": p, "k": setting.k, **r}
                log.write(json.dumps(row, separators=(",", ":")) + "\n")
                log.flush()
            if r.get("error") == "HTTP 429":  # the server is full: retry after a while, as told
                time.sleep(RETRY_AFTER_S)

    def inject() -> None:
        rng = random.Random(opts.seed)
        n = 1
        while counts["answered"] < workers and not counts["failed"] and not done.wait(0.5):
            pass  # no fault before an answer that queued (see the docstring)
        while not done.wait(max(0.0, t0 + n * fault_every - time.perf_counter())):
            with lock:  # a fault's request waits in the same queue as the load's requests
                patience = max(REQUEST_S, PATIENCE_FACTOR * max(recent, default=0.0))
            name = rng.choice(list(FAULTS))
            out = run_faults(setting.url, opts.api_key, [name], rng, patience_s=patience)[0]
            with lock:
                faults.append({"at_s": time.perf_counter() - t0, "patience_s": patience, **out})
            n = max(n + 1, math.ceil((time.perf_counter() - t0) / fault_every))

    samples: list[dict] = []

    def sample(root: httpx.Client) -> None:
        with lock:
            row = {"seconds": time.perf_counter() - t0, **counts, "faults": len(faults)}
        samples.append({**row, "health": _health(root)})

    with (
        server_client(setting.url, opts) as client,
        server_client(setting.url, opts, api=False) as root,
        (opts.out / "requests.jsonl").open("w") as log,
        ThreadPoolExecutor(workers + 1) as pool,
        tqdm(total=round(seconds), desc="soak", unit="s", file=sys.stderr) as bar,
    ):
        futures = [pool.submit(work, client, log) for _ in range(workers)]
        injector = pool.submit(inject) if fault_every else None
        sample(root)
        while not all(f.done() for f in futures):
            wait(futures, max(0.0, samples[-1]["seconds"] + every - (time.perf_counter() - t0)))
            sample(root)
            bar.n = min(round(samples[-1]["seconds"]), bar.total)
            bar.set_postfix_str(
                f"{counts['answered']} answered, {counts['failed']} failed, {len(faults)} faults"
            )
        done.set()
        for f in [*futures, *([injector] if injector else [])]:
            f.result()
        if fault_every:  # the last fault may have left work behind: a sample once idle
            _settle(root)
            sample(root)
        for p in tqdm(sorted(answers), desc="alone", unit="prompt", file=sys.stderr):
            ref = one_request(client, opts, opts.prompts[p], setting.k)  # on an idle server
            if "error" not in ref:
                checks += [alone_check(ref["logprobs"], got) for got in answers[p]]
    result = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "url": setting.url,
        "concurrency": workers,
        "k": setting.k,
        "seconds": seconds,
        "samples": samples,
        "errors": errors,
        "faults": faults,
        "alone": near_ties(checks, NEAR_TIE_FACTOR) if alone else None,
    }
    result["checks"] = soak_checks(result)
    lines = [*soak_table(samples), "", *soak_verdict(result)]
    (opts.out / "soak.json").write_text(json.dumps(result, indent=1))
    (opts.out / "soak.md").write_text(
        f"# specwise soak\n\nCommand: `{result['command']}`\n\n" + "\n".join(lines) + "\n"
    )
    print("\n".join(lines), file=stream)
    print(f"\nreport: {opts.out / 'soak.md'}", file=stream)
    return result


def _settle(root: httpx.Client, timeout_s: float = 15.0) -> None:
    """Wait (up to timeout_s) until /health says nothing is running, prefilling or queued."""
    end = time.perf_counter() + timeout_s
    while time.perf_counter() < end:
        h = _health(root)
        if not any(h.get(key) for key in ("running", "prefilling", "queued")):
            return
        time.sleep(0.2)


def soak_checks(result: dict) -> list[dict]:
    """Each criterion of a soak, what was measured and whether it passed (module docstring of
    `run_soak`); a criterion the server or the run gave nothing to judge by is left out."""
    out = []

    def check(name: str, measured: str, ok: bool) -> None:
        out.append({"check": name, "measured": measured, "ok": ok})

    five = {e: n for e, n in result["errors"].items() if e.startswith("HTTP 5")}
    five_faults = [f for f in result["faults"] if (f.get("status") or 0) >= 500]
    check(
        "no 5xx",
        f"{sum(five.values())} requests and {len(five_faults)} faults answered 5xx",
        not five and not five_faults,
    )
    lost = {e: n for e, n in result["errors"].items() if e != "HTTP 429" and e not in five}
    check(
        "every request of the load answered (429s aside: the queue was full)",
        f"{sum(lost.values())} not answered"
        + (f" ({', '.join(f'{n} {e}' for e, n in lost.items())})" if lost else ""),
        not lost,
    )
    if result["faults"]:
        bad = [f"{f['fault']}: {f['detail']}" for f in result["faults"] if not f["ok"]]
        check(
            "every fault taken as required",
            f"{len(result['faults']) - len(bad)} of {len(result['faults'])}"
            + (f" (not: {'; '.join(bad[:3])})" if bad else ""),
            not bad,
        )
    last = result["samples"][-1]["health"]
    check("the server answers /health at the end", "yes" if last else "no", bool(last))
    idle = {
        key: last[key] for key in ("running", "prefilling", "queued", "sequences") if key in last
    }
    if idle:
        measured = ", ".join(f"{key} {v:g}" for key, v in idle.items())
        check("nothing left running or holding cache", measured, not any(idle.values()))
    rss = [
        (s["seconds"], s["health"]["rss_mb"]) for s in result["samples"] if "rss_mb" in s["health"]
    ]
    after = [mb for t, mb in rss if t >= result["seconds"] / 4]
    if len(after) >= 2:
        growth = after[-1] / after[0] - 1
        check(
            "resident memory grows < 5% after the first quarter",
            f"{100 * growth:+.1f}%",
            growth < 0.05,
        )
    if result["alone"] is not None:
        a = result["alone"]
        check(
            "greedy answers as alone, or parted at near-ties",
            f"{a['matched']} of {a['answers']} as alone; {a['diverged']} parted, "
            f"{a['at_near_ties']} at near-ties (top-2 gap <= {a['factor']:g} x noise "
            f"{a['noise']:.3g})",
            a["answers"] > 0 and a["at_near_ties"] == a["diverged"],
        )
    return out


def soak_verdict(result: dict) -> list[str]:
    """The soak's checks for people, one line each, and the overall verdict."""
    lines = [
        f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}: {c['measured']}" for c in result["checks"]
    ]
    ok = all(c["ok"] for c in result["checks"])
    return [*lines, f"soak: {'passed' if ok else 'FAILED'}"]
