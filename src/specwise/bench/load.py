"""`specwise bench load`: a load generator for any OpenAI-compatible server.

For each concurrency level (and each speculation setting, when the server is specwise), N chat
requests run with that many in flight. Per request: TTFT (streaming only: time to the first
content chunk), continuation tokens/s after the first token, time per output token, end-to-end
latency and, streaming, its progress (completion tokens received by each chunk's time). Token
times come from the usage a chunk carries when the server sends one with every chunk
(`stream_options.continuous_usage_stats`, as specwise and vLLM do), else from counting chunks.
Every request's record (times from its run's start) goes to `requests.jsonl` in the output
folder; the level statistics (`bench.load_stats`: latency percentiles, aggregate and steady
throughput, the SLO, errors) to `load.json`, with a table in `report.md` and plots. Settings of
one level run back to back, so their numbers are side by side; with `rounds` > 1 each level
runs its settings that many times, in reversed order every other round (A B, B A, ...), so
drift of the machine weighs on every setting alike, and the statistics pool all rounds. Each
round of each level sends the next N prompts of the list (wrapping round only once the list is
used up: a server that caches prompts, or a drafter that remembers earlier answers, would
otherwise meet the same request again in the next level), the same ones for every setting of
the round; the CLI lists the prompts a category at a time in turn, so that any N of them mix
the categories. With several settings, each is compared with
the last one (e.g. `--k auto,0`: auto / 0) level by level. Several servers (e.g. one per
backend) make settings together with the k values: server by server, every k; each level runs
them all side by side, and the last (e.g. the mainline server's k=0) is the baseline.
Open loop (`rates`): a level is instead an arrival rate: requests arrive at the times of a
Poisson process (exponential gaps, seeded by the round, the same for every setting of the
round) whether or not earlier ones have finished, as users do; a closed loop slows its own
arrivals when the server slows, which flatters a slow setting. Every streaming level also
measures a service-level objective (`Slo`), and an open loop where it breaks.
Given `counters` (a reader of a server's speculative counters, `engines.counters`), each run
reads them before and after, and every level gets the acceptance figures of what its runs
counted (`speculation`); `bench engines` reads every engine's this way.
Talks HTTP only; it knows nothing of specwise's internals. What it is not: the statistics
(`bench.load_stats` computes them from the records), nor a soak, one level kept busy for a
given time (`bench.soak`, which sends its requests with `one_request`).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from specwise.bench.load_stats import (
    Level,
    Setting,
    Slo,
    fmt,
    level_stats,
    slo_breaks,
    throughput_ratios,
)

if TYPE_CHECKING:
    from specwise.engines.counters import Counters

__all__ = ["Level", "LoadOptions", "Setting", "Slo", "one_request", "run_load", "server_client"]


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
            f"{lv['throughput_tokens_per_s']:8.2f} {fmt(lv['steady_tokens_per_s']):>8} "
            f"{fmt(lv['latency_s']['p50']):>7} "
            f"{fmt(lv['latency_s']['p90']):>7} {fmt(lv['latency_s']['p99']):>7} "
            f"{fmt(lv['ttft_s']['p50']):>8} {fmt(lv['ttft_s']['p90']):>8} "
            f"{fmt(lv['tpot_s']['p50'], '.3f'):>8} {met:>7} "
            f"{fmt(lv['goodput_requests_per_s'], '.3f'):>7} {lv['errors']:>6}"
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
    levels = [level_stats(lv, x, rs, opts.slo, opts.stream) for (lv, x), rs in runs.items()]
    for lv, key in zip(levels, runs, strict=True):  # the counts of all its runs together
        c = counted.get(key) or [None]
        total = None if None in c else functools.reduce(lambda a, b: a.plus(b), c)
        lv["speculation"] = total.figures() if total is not None and total.drafts else None
    ratios = throughput_ratios(levels)
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
