"""`specwise bench adapt`: how a drafter on hidden states (the heads, or with `--drafter eagle`
the eagle layer) adapts to traffic it was not trained for.

The workload is `asks.SHIFTED`: standard-library functions to rewrite in Ruby, a way of
asking, and a language, that `heads train` never uses. Each prompt is decoded, one after the
other, by three engines on the same target, interleaved so that the machine's drift falls on
all three alike:

- `plain`: no drafter, the baseline of every ratio;
- `heads` (or `eagle`): the trained network at a fixed k, as trained;
- `heads+adapt` (`eagle+adapt`): the same with an `Adapter` (global scope, the server's
  defaults) whose training thread runs only while this engine decodes (within `budget` of a
  core), so its CPU time there is charged to it alone, and in the user's think time after
  each of its requests (`think` seconds at most, within `idle_budget`): the time a server
  waits for the next request, which no configuration is timed in. The think time ends as soon
  as the thread has nothing left to learn; `think=0` serves the requests back to back.

Per request: tokens, time, continuation speed (tokens after the first over their time: the
prompt's prefill, the same for all three, left out), proposed and accepted draft tokens, and
the speedup over plain on the same prompt, and the think time the adaptation used after it;
per window of `WINDOW` requests the acceptance rate (accepted over proposed) and the median
speedup; and how often the outputs differ from plain (greedy: they must not,
but at a near-tie, which a forward of two tokens may break otherwise than one of one token:
`bench`'s divergence check, with its measured noise). After a warm-up of the plain and
trained engines (not the adapting one, which learns from the run's requests alone). Written to
the output folder as requests.jsonl, meta.json, report.md and by_request.png (`rebuild`, and
`specwise bench report <folder>`, write the last two again from the first two).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specwise.adapt import Adapter
from specwise.backends.base import LM
from specwise.bench.runner import NEAR_TIE_FACTOR, greedy_divergence, numeric_noise
from specwise.drafters.eagle import EagleDrafter, Layer
from specwise.drafters.heads import Heads, HeadsDrafter
from specwise.engine import Engine
from specwise.sampling import SamplingParams

__all__ = ["WINDOW", "rebuild", "run", "table"]

WINDOW = 50  # requests per row of the report (the first and last 50 of 200)


def _configs(drafter: str) -> tuple[str, str, str]:
    return ("plain", drafter, f"{drafter}+adapt")


def run(
    target: LM,
    net: Heads | Layer,
    out: Path,
    requests: int = 200,
    k: int = 1,
    max_tokens: int = 64,
    temperature: float = 0.0,
    budget: float = 0.1,
    idle_budget: float = 1.0,
    think: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Decode `requests` shifted prompts with each configuration; write the folder's files and
    return the report's lines."""
    from tqdm import tqdm

    from specwise.asks import SHIFTED, code_prompts

    prompts = code_prompts(limit=requests, seed=1, asks=SHIFTED)
    if len(prompts) < requests and progress is not None:
        progress(f"the standard library gave {len(prompts)} prompts, not {requests}")
    adapter = Adapter(net, scope="global", budget=budget, idle_budget=idle_budget)
    make = EagleDrafter if isinstance(net, Layer) else HeadsDrafter
    plain, trained, adapting = _configs(adapter.kind)
    engines = {
        plain: Engine(target),
        trained: Engine(target, make(net), k=k),
        adapting: Engine(target, make(net, adapter), k=k, learner=adapter),
    }
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    tok = target.tokenizer
    warm = tok.render_chat([{"role": "user", "content": "Write a function that adds two numbers."}])
    for name in (plain, trained):  # the adapting engine's copy must learn from the run alone
        engines[name].generate(warm, SamplingParams(max_tokens=8))
    greedy = temperature == 0
    noise = numeric_noise(target, warm) if greedy else None
    near_tie = NEAR_TIE_FACTOR * noise["top2_gap"] if noise else 0.0
    adapter.pause()
    adapter.start()
    try:
        with open(out / "requests.jsonl", "w") as f:
            for i, text in enumerate(tqdm(prompts, desc="bench adapt", unit="request")):
                ids = tok.render_chat([{"role": "user", "content": text}])
                params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=i)
                got = {}
                for name, engine in engines.items():
                    if name == adapting:
                        adapter.resume()
                    t = time.perf_counter()
                    res = engine.generate(ids, params)
                    seconds = time.perf_counter() - t
                    idle = _think(adapter, think) if name == adapting else 0.0
                    adapter.pause()
                    s = res.summary
                    got[name] = res.tokens
                    rows.append(
                        {
                            "index": i,
                            "config": name,
                            "tokens": len(res.tokens),
                            "seconds": round(seconds, 4),
                            "tokens_per_s": s.continuation_tokens_per_s,
                            "proposed": s.proposed,
                            "accepted": s.accepted,
                            "adapt_steps": adapter.steps,
                            "adapt_idle_steps": adapter.idle_steps,
                            "think_s": round(idle, 4),
                        }
                    )
                plain = rows[-len(engines)]
                for r in rows[-len(engines) :]:
                    both = r["tokens_per_s"] and plain["tokens_per_s"]  # None: one token
                    r["speedup"] = (
                        round(r["tokens_per_s"] / plain["tokens_per_s"], 4) if both else None
                    )
                    r["same_as_plain"] = got[r["config"]] == got["plain"]
                    if greedy and not r["same_as_plain"]:  # outside the timed part
                        div = greedy_divergence(
                            target, ids, got["plain"], got[r["config"]], near_tie
                        )
                        r |= {"near_tie": div["near_tie"], "top2_gap": div["top2_gap"]}
                        r["diverged_at"] = div["position"]
                    f.write(json.dumps(r) + "\n")
    finally:
        adapter.close()
    meta = {
        "model": Path(target.info.model).name,
        "backend": target.info.backend,
        "drafter": adapter.kind,
        "k": k,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "budget": budget,
        "idle_budget": idle_budget,
        "think": think,
        "near_tie": near_tie,
        **adapter.stats(),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return _write_report(rows, meta, out)


def rebuild(out: Path) -> list[str]:
    """report.md and by_request.png of the run in `out` again, from its requests.jsonl and
    meta.json; the report's lines."""
    try:
        meta = json.loads((out / "meta.json").read_text())
        rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    except OSError as e:
        raise ValueError(f"{out} holds no bench adapt run: cannot read {e.filename}") from None
    except ValueError:
        raise ValueError(f"{out} holds a damaged bench adapt run: a file is not JSON") from None
    if not rows:
        raise ValueError(f"{out / 'requests.jsonl'} has no requests; nothing to report")
    return _write_report(rows, meta, out)


def _write_report(rows: Sequence[dict], meta: dict, out: Path) -> list[str]:
    lines = table(rows, meta)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    _plot(rows, out / "by_request.png", meta["temperature"], _configs(meta.get("drafter", "heads")))
    return lines


def _think(adapter: Adapter, seconds: float) -> float:
    """The user's think time after a request: the adapter trains alone, untimed, until it has
    nothing left to learn or `seconds` pass. The seconds it took."""
    t = time.perf_counter()
    while adapter.busy() and time.perf_counter() - t < seconds:
        time.sleep(0.01)
    return time.perf_counter() - t


def _rate(rows: Sequence[dict]) -> float | None:
    proposed = sum(r["proposed"] for r in rows)
    return sum(r["accepted"] for r in rows) / proposed if proposed else None


def _median(xs: Sequence[float | None]) -> float | None:
    kept = [x for x in xs if x is not None]
    return float(np.median(kept)) if kept else None


def _fmt(x: float | None, pattern: str) -> str:
    return "—" if x is None else pattern.format(x)


def table(rows: Sequence[dict], meta: dict) -> list[str]:
    """The report: per window of WINDOW requests, acceptance and median speedup over plain of
    the drafter as trained and adapting; then the last window's acceptance over the first's,
    and each window's adapting acceptance over the trained one's."""
    n = 1 + max((r["index"] for r in rows), default=-1)
    configs = _configs(meta.get("drafter", "heads"))
    _, d, da = configs
    lines = [
        f"# bench adapt: {meta['model']} ({meta['backend']}), {d} k={meta['k']}, "
        f"{meta['max_tokens']} tokens, T={meta['temperature']:g}, adaptation budget "
        f"{meta['budget']:g} of a core while a request decodes"
        + (
            f", {meta['idle_budget']:g} in up to {meta['think']:g} s of think time after each"
            if meta.get("think")  # a run before think time: back to back
            else ", requests back to back"
        ),
        "",
        f"| requests | acceptance, {d} | acceptance, {da} | speedup, {d} | "
        f"speedup, {da} | plain tok/s |",
        "|---|---|---|---|---|---|",
    ]
    windows = [range(a, min(n, a + WINDOW)) for a in range(0, n, WINDOW)]
    rates = {}
    for w in windows:
        by = {c: [r for r in rows if r["config"] == c and r["index"] in w] for c in configs}
        rates[w.start] = {c: _rate(by[c]) for c in configs[1:]}
        speed = {c: _median([r["speedup"] for r in by[c]]) for c in configs[1:]}
        plain = _median([r["tokens_per_s"] for r in by["plain"]])
        lines.append(
            f"| {w.start + 1}–{w.stop} | {_fmt(rates[w.start][d], '{:.3f}')} | "
            f"{_fmt(rates[w.start][da], '{:.3f}')} | "
            f"{_fmt(speed[d], '{:.2f}x')} | {_fmt(speed[da], '{:.2f}x')} | "
            f"{_fmt(plain, '{:.1f}')} |"
        )
    lines.append("")
    if len(windows) > 1:
        first, last = rates[windows[0].start], rates[windows[-1].start]
        for c in configs[1:]:
            ratio = None if not first[c] or last[c] is None else last[c] / first[c]
            lines.append(
                f"- {c}: acceptance over requests {windows[-1].start + 1}–{windows[-1].stop} is "
                f"{_fmt(ratio, '{:.2f}')}x that over 1–{windows[0].stop}"
            )
    gain = [
        None if not r[d] or r[da] is None else r[da] / r[d]
        for r in (rates[w.start] for w in windows)
    ]
    lines.append(
        f"- acceptance, {da} over {d}, window by window: "
        + ", ".join(_fmt(g, "{:.2f}x") for g in gain)
    )
    differ = {c: [r for r in rows if r["config"] == c and not r["same_as_plain"]] for c in configs}
    ties = {c: sum(bool(r.get("near_tie")) for r in differ[c]) for c in configs}
    lines.append(
        f"- outputs differing from plain: {d} {len(differ[d])} ({ties[d]} at a "
        f"near-tie), {da} {len(differ[da])} ({ties[da]} at a "
        f"near-tie) of {n}; {meta['steps']} training steps"
        + (f" ({meta['idle_steps']} in think time)" if meta.get("think") else "")
        + f", {meta['swaps']} swaps, {meta['examples']} positions learnt from"
    )
    thought = [r["think_s"] for r in rows if r["config"] == da and "think_s" in r]
    if meta.get("think") and thought:
        lines.append(
            f"- think time the adaptation used after a request: median "
            f"{_median(thought):.2f} s, at most {max(thought):.2f} s (of {meta['think']:g} s)"
        )
    return lines


def _plot(
    rows: Sequence[dict], path: Path, temperature: float, configs: Sequence[str], span: int = 10
) -> None:
    """by_request.png: each configuration's acceptance and median speedup over the last
    `span` requests, against the request's place in the run."""
    from specwise.bench.plots import by_request

    series = {}
    for c in configs[1:]:
        mine = [r for r in rows if r["config"] == c]
        series[f"{c} ({span}-request window)"] = [
            {
                "index": r["index"],
                "speedup": _median([x["speedup"] for x in mine[max(0, i + 1 - span) : i + 1]]),
                "acceptance_rate": _rate(mine[max(0, i + 1 - span) : i + 1]),
            }
            for i, r in enumerate(mine)
        ]
    by_request({f"T={temperature:g}": series}, path)
