"""`specwise bench engines`: specwise's server and llama-server on the same model files, prompts,
sampling (greedy) and token budget, each with speculation on and off, measured side by side
with one yardstick (`bench.load`).

Settings, in this order (the last is the baseline of every ratio):
- specwise: one `specwise serve` of the pair (`--max-batch` the highest concurrency), its
  requests sent with `speculative.k` = each of `ks` (default auto, then 0: plain), each k with
  an API key of its own: a tenant, so what the suffix drafter remembers of one setting's
  answers never drafts another's (every setting of a round sends the same prompts);
- servers given by URL (`urls`, NAME=URL): as they run, nothing engine-specific sent;
- llama-server: one server a mode (`engines.llama_server.MODES`), the speculative ones first
  and `none` (speculation off) last, each with the same slots and threads as specwise.
Every server starts before the first request and idles while another is measured, so each
level runs all settings back to back, the order reversed every other round.

Outputs in the run folder: `summary.json` (the engines, each setting's command line, per
level and setting the load statistics and the acceptance figures from the engine's own
counters (`engines.counters`), and the comparisons), `report.md`, the load's plots and
requests.jsonl (under load/), and each server's log (under logs/).

Comparisons, level by level: each setting against its own engine's speculation-off setting and
against the baseline, as the ratio of throughputs (completion tokens over the level's wall
time, every round pooled), with a 95% bootstrap interval of the ratio of per-request speeds
(completion tokens over latency, requests paired by prompt and round; resampling pairs).
"""

from __future__ import annotations

import io
import json
import sys
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from specwise.backends.llama_cpp import default_threads
from specwise.bench.figures import ratio_ci
from specwise.bench.load import LoadOptions, Setting, run_load
from specwise.engines import counters as engine_counters
from specwise.engines import llama_server
from specwise.engines.process import ServerProcess, free_port

__all__ = ["EnginesOptions", "Planned", "compare", "run_engines"]

ENGINES = ("specwise", "llama-server")


@dataclass
class EnginesOptions:
    target: str  # catalog names
    draft: str
    engines: list[str]  # of ENGINES
    prompts: list[str]
    out: Path
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4])
    ks: list[int | str] = field(default_factory=lambda: ["auto", 0])  # specwise's
    modes: list[str] = field(default_factory=lambda: list(llama_server.MODES))  # llama-server's
    urls: dict[str, str] = field(default_factory=dict)  # running servers, used as they are
    requests: int = 8
    rounds: int = 2
    max_tokens: int = 96
    backend: str | None = None  # specwise serve's --backend
    pair: str | None = None  # the catalog pair target and draft come from, if one
    api_key: str | None = None  # for the servers given by URL


@dataclass
class Planned:
    """A setting and what it is: its engine, whether speculation is off, the server's command
    line (None: a server given by URL) and, for llama-server, its mode."""

    label: str
    engine: str
    plain: bool
    k: int | str | None = None
    mode: str | None = None
    command: list[str] | None = None
    url: str = ""
    api_key: str | None = None


def _specwise_command(opts: EnginesOptions, port: int, keys: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "specwise", "serve", "--target", opts.target]
    cmd += ["--draft", opts.draft, "--port", str(port), "--max-batch", str(max(opts.concurrency))]
    cmd += [a for key in keys for a in ("--api-key", key)]
    return cmd + (["--backend", opts.backend] if opts.backend else [])


def plan(opts: EnginesOptions, files: dict[str, Path], binary: Path | None) -> list[Planned]:
    """The settings of the module docstring, with their commands (ports chosen now)."""
    out: list[Planned] = []
    if "specwise" in opts.engines:
        keys = [f"specwise-k-{k}" for k in opts.ks]
        cmd = _specwise_command(opts, free_port(), keys)
        out += [
            Planned(f"specwise k={k}", "specwise", k == 0, k=k, command=cmd, api_key=key)
            for k, key in zip(opts.ks, keys, strict=True)
        ]
    out += [Planned(name, name, False, url=url) for name, url in opts.urls.items()]
    if "llama-server" in opts.engines:
        threads = default_threads()  # as many as specwise's own server uses
        for mode in sorted(opts.modes, key=lambda m: m == "none"):
            cmd = llama_server.command(
                binary,
                files["target"],
                mode,
                free_port(),
                max(opts.concurrency),
                threads,
                draft=files["draft"],
            )
            label = f"llama-server {mode}"
            out.append(Planned(label, "llama-server", mode == "none", mode=mode, command=cmd))
    return out


def _read_counters(api_key: str | None):
    """A function: a server's URL -> its speculative counters now (None: none to read)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def read(url: str) -> engine_counters.Counters | None:
        try:
            r = httpx.get(url.rstrip("/").removesuffix("/v1") + "/metrics", headers=headers)
        except httpx.HTTPError:
            return None
        return engine_counters.read(r.text) if r.status_code == 200 else None

    return read


def _rows(path: Path) -> dict[tuple[str, str, str | int | None], list[dict]]:
    """requests.jsonl by (level, server name, k)."""
    out: dict = defaultdict(list)
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            out[(r["level"], r["server"], r["k"])].append(r)
    return out


def _paired_ci(a: list[dict], b: list[dict]) -> tuple[float, float]:
    """95% interval of the per-request speed ratio a / b, requests paired by (round, prompt)."""
    by = {(r["round"], r["prompt"]): r for r in b if "error" not in r}
    pairs = [
        (r, by[(r["round"], r["prompt"])])
        for r in a
        if "error" not in r and (r["round"], r["prompt"]) in by
    ]
    tokens = np.array([[x["tokens"], y["tokens"]] for x, y in pairs], float)
    times = np.array([[x["latency_s"], y["latency_s"]] for x, y in pairs], float)
    return ratio_ci(tokens, times)


def compare(levels: list[dict], planned: list[Planned], rows: dict) -> list[dict]:
    """Level by level, each setting against its engine's speculation-off setting (`own`) and
    against the baseline (the last setting): throughput ratio and the paired interval."""
    by_label = {p.label: p for p in planned}
    base = planned[-1]
    plain = {p.engine: p for p in planned if p.plain}
    out = []
    for level in dict.fromkeys(lv["level"] for lv in levels):
        at = {lv["setting"]: lv for lv in levels if lv["level"] == level}
        for lv in at.values():
            p = by_label[lv["setting"]]
            row = {"level": level, "setting": p.label, "engine": p.engine}
            for key, other in (("own", plain.get(p.engine)), ("baseline", base)):
                if other is None or other.label == p.label or other.label not in at:
                    row[key] = None
                    continue
                mine = rows.get((level, lv["server"], lv["k"]), [])
                theirs = rows.get((level, at[other.label]["server"], at[other.label]["k"]), [])
                ratio = lv["throughput_tokens_per_s"] / at[other.label]["throughput_tokens_per_s"]
                row[key] = {"vs": other.label, "ratio": ratio, "ci95": _paired_ci(mine, theirs)}
            out.append(row)
    return out


def _f(x, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def _vs(c: dict | None) -> str:
    if c is None:
        return "-"
    lo, hi = c["ci95"]
    return f"{c['ratio']:.2f}x ({_f(lo)}–{_f(hi)})"


def table(levels: list[dict], comparisons: list[dict]) -> list[str]:
    """The report's markdown table: a row per level and setting."""
    by = {(c["level"], c["setting"]): c for c in comparisons}
    base = comparisons[-1]["setting"] if comparisons else ""
    lines = [
        f"| in flight | setting | tok/s | over its own plain (95% CI) | over {base} (95% CI) | "
        "TTFT p50 s | latency p50 s | acceptance | τ | draft length | α by position |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        c = by[(lv["level"], lv["setting"])]
        s = lv.get("speculation") or {}
        alpha = ", ".join(_f(a) for a in (s.get("alpha_per_position") or [])[:6])
        lines.append(
            f"| {lv['level']} | {lv['setting']} | {lv['throughput_tokens_per_s']:.2f} | "
            f"{_vs(c['own'])} | {_vs(c['baseline'])} | {_f(lv['ttft_s']['p50'])} | "
            f"{_f(lv['latency_s']['p50'])} | {_f(s.get('acceptance_rate'))} | "
            f"{_f(s.get('tau'))} | {_f(s.get('mean_draft_length'), '.1f')} | {alpha or '-'} |"
        )
    return lines


def headline(comparisons: list[dict]) -> list[str]:
    """Per level: each engine's best speculative setting against the baseline."""
    lines = []
    for level in dict.fromkeys(c["level"] for c in comparisons):
        best: dict[str, dict] = {}
        for c in comparisons:
            if c["level"] != level or c["own"] is None or c["baseline"] is None:
                continue
            if (
                c["engine"] not in best
                or c["baseline"]["ratio"] > best[c["engine"]]["baseline"]["ratio"]
            ):
                best[c["engine"]] = c
        parts = [f"{c['setting']} {_vs(c['baseline'])}" for c in best.values()]
        if parts:
            vs = next(iter(best.values()))["baseline"]["vs"]
            lines.append(f"{level} in flight, over {vs}: " + "; ".join(parts))
    return lines


def run_engines(opts: EnginesOptions, stream=None) -> dict:
    """Start the servers, run the load, compare, write the outputs; returns the summary."""
    from specwise.backends import resolve_model
    from specwise.machine import machine

    stream = stream or sys.stdout
    files = {"target": resolve_model(opts.target), "draft": resolve_model(opts.draft)}
    binary = llama_server.find() if "llama-server" in opts.engines else None
    planned = plan(opts, files, binary)
    opts.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        urls: dict[tuple, str] = {}  # command -> its server's URL
        for p in planned:
            if p.command is None:
                continue
            key = tuple(p.command)
            if key not in urls:
                port = int(p.command[p.command.index("--port") + 1])
                name = p.label if p.engine != "specwise" else "specwise"
                log = opts.out / "logs" / f"{name.replace(' ', '-')}.log"
                print(f"starting {name} (log: {log})", file=sys.stderr)
                urls[key] = stack.enter_context(ServerProcess(name, p.command, port, log))
            p.url = urls[key]
        # labels as `planned`'s: "specwise k=auto", "llama-server ngram-mod", a URL's name
        settings = [
            Setting(p.url, p.k, "specwise", api_key=p.api_key)
            if p.engine == "specwise"
            else Setting(p.url, None, p.label)
            for p in planned
        ]
        load = LoadOptions(
            urls={s.label: s.url for s in settings},
            concurrency=opts.concurrency,
            prompts=opts.prompts,
            ks=[None],
            out=opts.out / "load",
            requests=opts.requests,
            rounds=opts.rounds,
            max_tokens=opts.max_tokens,
            stream=True,
            only=settings,
            counters=_read_counters(opts.api_key),
            api_key=opts.api_key,
        )
        load_table = io.StringIO()
        levels = run_load(load, stream=load_table, json_line=False)
    comparisons = compare(levels, planned, _rows(load.out / "requests.jsonl"))
    summary = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "pair": opts.pair,
        "models": {"target": opts.target, "draft": opts.draft},
        "files": {k: str(v) for k, v in files.items()},
        "llama_server": {"version": llama_server.VERSION, "binary": str(binary)}
        if binary
        else None,
        "max_tokens": opts.max_tokens,
        "requests": opts.requests,
        "rounds": opts.rounds,
        "concurrency": opts.concurrency,
        "settings": [asdict(p) for p in planned],
        "levels": levels,
        "comparisons": comparisons,
    }
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = [*table(levels, comparisons), "", *headline(comparisons)]
    commands = [f"- {p.label}: `{' '.join(p.command or [p.url])}`" for p in planned]
    (opts.out / "report.md").write_text(
        f"# specwise engines report\n\nCommand: `{summary['command']}`\n\n"
        f"Machine: {summary['machine']}\n\n"
        + "\n".join(lines)
        + "\n\nSettings:\n\n"
        + "\n".join(commands)
        + f"\n\nThe load's own table (`bench load`):\n\n```\n{load_table.getvalue()}```\n"
    )
    print("\n".join(lines), file=stream)
    print(f"\nreport: {opts.out / 'report.md'}", file=stream)
    return summary
