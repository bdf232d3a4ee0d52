"""One `specwise bench` run: pick prompts, run the matrix with a progress bar, write
rounds.jsonl / requests.jsonl / summary.json / report.md and the plots, print the tables for
people (a table per sampling, exactness, one verdict line: `bench.console`) and the report's
path (and, with `json_line`, the compact summary as one JSON line last, for machines). It
loads nothing itself: it gets the models from its caller. `rebuild` makes the same outputs
again from a run's JSONL files (after the report changes, or to look at a run that was stopped
part way)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from specwise.backends.base import LM
from specwise.bench.plots import write_plots
from specwise.bench.report import Report, build
from specwise.bench.runner import Options, Runner
from specwise.prompts import Prompt
from specwise.trace import JsonlSink

__all__ = ["default_out", "pick", "rebuild", "run_bench"]


def default_out(suffix: str = "") -> Path:
    """bench-results/<timestamp><suffix>: where a bench run goes without --out."""
    return Path("bench-results") / (datetime.now().strftime("%Y%m%d-%H%M%S") + suffix)


def pick(prompts: Sequence[Prompt], limit: int | None) -> list[Prompt]:
    """At most `limit` prompts per category, in order."""
    if limit is None:
        return list(prompts)
    if limit < 1:
        raise ValueError(f"--limit {limit} is invalid; use an integer >= 1")
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        if seen.get(p.category, 0) < limit:
            seen[p.category] = seen.get(p.category, 0) + 1
            out.append(p)
    return out


def run_bench(
    target: LM,
    draft: LM | None,
    prompts: Sequence[Prompt],
    options: Options,
    out: Path,
    run_info: dict,
    stream=None,
    json_line: bool = False,
    baseline: LM | None = None,
) -> Report:
    from tqdm import tqdm

    stream = stream or sys.stdout
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(target, draft, options, baseline)
    total = sum(len(runner.configs(p.category)) for p in prompts) * options.repeats
    records: list[dict] = []
    rounds: list[dict] = []
    t0 = time.perf_counter()
    with (
        JsonlSink(out / "rounds.jsonl") as rsink,
        JsonlSink(out / "requests.jsonl") as qsink,
        tqdm(total=total, desc="bench", unit="req", file=sys.stderr) as bar,
    ):

        def on_request(record: dict, rs: list[dict]) -> None:
            records.append(record)
            rounds.extend(rs)
            qsink.write(record)
            for r in rs:
                rsink.write(r)
            qsink.flush()
            rsink.flush()
            bar.set_postfix_str(f"{record['category']} {record['spec']}")

        runner.run(prompts, on_request, progress=bar.update)
    run = {
        **run_info,
        "prompts": len(prompts),
        "max_tokens": options.max_tokens,
        "repeats": options.repeats,
        "duration_s": time.perf_counter() - t0,
        "threads": target.info.threads,
        "numeric_noise": runner.noise,
        "near_tie_below": runner.near_tie,
        "calibrated_ms": runner.calibrated,
    }
    return publish(records, rounds, run, out, stream, json_line)


def rebuild(out: Path, stream=None, json_line: bool = False) -> Report:
    """Rebuild summary.json, report.md and the plots of the run in `out` from its
    requests.jsonl and rounds.jsonl (the run's settings come from its summary.json, if any)."""
    out = Path(out)
    try:
        records = _read_jsonl(out / "requests.jsonl")
        rounds = _read_jsonl(out / "rounds.jsonl")
    except OSError as e:
        raise ValueError(
            f"{out} holds no bench run: cannot read {e.filename} ({e.strerror})"
        ) from None
    if not records:
        raise ValueError(f"{out / 'requests.jsonl'} has no requests; nothing to report")
    try:
        run = json.loads((out / "summary.json").read_text())["run"]
    except (OSError, ValueError, KeyError):
        run = {"command": "(rebuilt; the run's summary.json is missing)"}
    prompts = {(r["category"], r["prompt_id"]) for r in records}
    run = {**run, "prompts": len(prompts), "requests": len(records)}
    return publish(records, rounds, run, out, stream or sys.stdout, json_line)


def _read_jsonl(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            # A run killed mid-write leaves its last line cut short; only that one may be.
            if n < len(lines):
                raise ValueError(f"{path}:{n} is not JSON; the file is damaged") from None
    return out


def publish(
    records: list[dict], rounds: list[dict], run: dict, out: Path, stream, json_line: bool = False
) -> Report:
    """Aggregate, write summary.json, report.md and the plots into `out`, print the tables
    for people (`Report.table`: a table per sampling, exactness, the verdict, which names any
    equivalence failure), the report's path and, with json_line, the compact summary as one
    JSON line (it is in summary.json either way)."""
    report = build(records, rounds, run)
    report.write(out)
    plots = write_plots(report.figures, out, report.requests)
    print(report.table(), file=stream)  # ends with the verdict, which names any failure
    failed = report.failures()
    print(
        f"report: {out / 'report.md'} (summary.json; plots: {', '.join(p.name for p in plots)})",
        file=stream,
    )
    if not json_line:
        return report
    keep = (
        "speedup_total",
        "speedup_median",
        "speedup_ci95",
        "speedup_vs_baseline",
        "acceptance_rate",
        "mean_accepted_length",
        "goodput_tokens_per_ms",
        "ttft_ms",
        "equivalence_ok",
    )
    compact = {
        "run": report.run,
        "figures": {
            cat: {
                s: {spec: {k: f.get(k) for k in keep} for spec, f in by_spec.items()}
                for s, by_spec in by_s.items()
            }
            for cat, by_s in report.figures.items()
        },
        "recommendation": report.recommendation,
        "auto_vs_hindsight": report.hindsight,
        "lossy": {  # apart: not the target's distribution
            cat: {
                s: {
                    spec: {k: f.get(k) for k in (*keep[:2], "logprob_diff", "same_as_exact")}
                    for spec, f in by_spec.items()
                }
                for s, by_spec in by_s.items()
            }
            for cat, by_s in report.lossy.items()
        },
        "equivalence_failures": failed,
        "out": str(out),
    }
    print(json.dumps(compact, default=_plain, separators=(",", ":")), file=stream)
    return report


def _plain(x):
    return None if isinstance(x, float) and x != x else str(x)
