"""BENCHMARKS.md's headline: this project against mainline llama.cpp's plain decoding and
llama-server, on each machine kind measured, as markdown made from small committed run
summaries (`benchmarks/*.json`, one per run: the machine's `lscpu` model, the commit, the
command, where in BENCHMARKS.md the run is told, and its figures as measured).
`specwise bench headline` prints it; `--into BENCHMARKS.md` replaces the section between its
markers.

A summary's figures are ratios and tokens/s copied from a run's own report; this module prints
them as they are (it computes no figure, and a figure a summary lacks is said to be missing,
never filled in). A summary holds, besides its machine and run:
- `bench` (one request at a time): sampling -> category ("all" over them) -> `auto` (over
  specwise's plain decoding), `auto_ci95`, `auto_over_mainline` (over plain decoding on
  mainline llama.cpp), `mainline_plain` (mainline's plain over specwise's) or
  `plain_over_mainline` (the other way), `acceptance`, and tokens/s where measured
  (`plain_tok_s`, `auto_tok_s`, `mainline_plain_tok_s`);
- `server`: rows of `in_flight`, `tok_s` (by setting: `specwise auto`, `specwise plain`,
  `mainline plain`, `mainline auto`, `llama-server none`, `llama-server best`, ...) and `over`
  (ratios as the run reported them, by name).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["BEGIN", "END", "into", "load", "markdown"]

BEGIN = "<!-- headline: made by `specwise bench headline --into BENCHMARKS.md` from benchmarks/*.json; edit those, not this section -->"
END = "<!-- /headline -->"
REQUIRED = ("machine", "lscpu", "command", "source", "what")
SERVER_COLUMNS = (
    "specwise auto",
    "specwise plain",
    "mainline plain",
    "llama-server none",
    "llama-server best",
)


def load(folder: Path) -> list[dict]:
    """The run summaries in `folder`: machine kinds by their newest run, each one's runs newest
    first (by `date`, the commit's; those without one last). A file that is not a summary is
    one sentence (ValueError) naming it and the fault."""
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise ValueError(f"{folder} holds no run summaries (*.json); nothing to make a headline of")
    runs = []
    for path in files:
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} is not a readable JSON run summary ({e})") from None
        if not isinstance(run, dict):
            raise ValueError(f"{path} holds no JSON object; a run summary is one")
        missing = [k for k in REQUIRED if not isinstance(run.get(k), str) or not run[k]]
        if missing:
            raise ValueError(f"{path} lacks {', '.join(missing)}; see {__name__}'s docstring")
        if "bench" not in run and "server" not in run:
            raise ValueError(f"{path} has neither bench nor server figures")
        runs.append({**run, "file": path.name})
    newest: dict[str, str] = {}
    for r in runs:
        newest[r["machine"]] = max(newest.get(r["machine"], ""), r.get("date") or "")
    return sorted(
        runs, key=lambda r: (newest[r["machine"]], r["machine"], r.get("date") or ""), reverse=True
    )


def _x(v) -> str:
    return "not reported" if v is None else f"{v:.2f}x"


def _cell(bench: dict, sampling: str, category: str, key: str) -> str:
    """A ratio of the summary, or why there is none: the run did not run that sampling or
    category, or its report (as BENCHMARKS.md gives it) has no such figure."""
    if category not in bench.get(sampling, {}):
        return "not run"
    return _x(bench[sampling][category].get(key))


def _machine(run: dict) -> str:
    if run["lscpu"] == run["machine"]:
        return run["machine"]
    return f'{run["machine"]} ("{run["lscpu"]}")'


def _run_name(run: dict) -> str:
    commit = f"`{run['commit']}`" if run.get("commit") else "commit not recorded"
    return f"{run['source']}, {commit}"


def _spread(by_category: dict) -> str:
    """The best and the worst category over mainline plain."""
    cats = {
        c: f["auto_over_mainline"]
        for c, f in by_category.items()
        if c != "all" and f.get("auto_over_mainline") is not None
    }
    if not cats:
        return "not reported"
    hi, lo = max(cats, key=cats.get), min(cats, key=cats.get)
    if len(cats) == 1:
        return f"{hi} {cats[hi]:.2f}x (the one category reported)"
    return f"{hi} {cats[hi]:.2f}x to {lo} {cats[lo]:.2f}x"


def _bench_table(runs: list[dict]) -> list[str]:
    samplings = list(dict.fromkeys(s for r in runs for s in r["bench"]))
    first = samplings[0]
    out = [
        "| machine (`lscpu` model) | run | prompts | "
        + " | ".join(f"`auto` over mainline plain, {s}" for s in samplings)
        + f" | `auto` over specwise's plain, {first} (95% CI) | by category, {first} |",
        "|---" * (len(samplings) + 5) + "|",
    ]
    for r in runs:
        b = r["bench"]
        cells = [_cell(b, s, "all", "auto_over_mainline") for s in samplings]
        own = _cell(b, first, "all", "auto")
        lo_hi = b.get(first, {}).get("all", {}).get("auto_ci95")
        own += f" ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})" if lo_hi else ""
        out.append(
            f"| {_machine(r)} | {_run_name(r)}: {r['what']} | {r.get('prompts', 'not recorded')} | "
            + " | ".join(cells)
            + f" | {own} | {_spread(b.get(first, {}))} |"
        )
    return out


def _category_table(runs: list[dict]) -> list[str]:
    """A row per category, a column per run that reported categories: auto over mainline
    plain at T=0 and T=0.7."""
    runs = [r for r in runs if len(r["bench"].get("T=0", {})) > 3]  # categories, not a demo's
    if not runs:
        return []
    cats = list(dict.fromkeys(c for r in runs for c in r["bench"]["T=0"] if c != "all"))
    out = [
        "| category | "
        + " | ".join(f"{r['machine']}, {_run_name(r)}: T=0 / T=0.7" for r in runs)
        + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    for c in [*cats, "all"]:
        cells = []
        for r in runs:
            pair = [_cell(r["bench"], s, c, "auto_over_mainline") for s in ("T=0", "T=0.7")]
            cells.append("not run" if pair == ["not run"] * 2 else " / ".join(pair))
        out.append(f"| {'**all**' if c == 'all' else c} | " + " | ".join(cells) + " |")
    return out


def _server_table(runs: list[dict]) -> list[str]:
    out = [
        "| machine (`lscpu` model) | run | in flight | "
        + " | ".join(f"{c}, tok/s" for c in SERVER_COLUMNS)
        + " | `auto` over (as the run reported) |",
        "|---" * (len(SERVER_COLUMNS) + 4) + "|",
    ]
    for r in runs:
        for row in r["server"]["rows"]:
            tok, best = row["tok_s"], row.get("best_mode")
            cells = ["not run" if tok.get(c) is None else f"{tok[c]:g}" for c in SERVER_COLUMNS]
            if best and tok.get("llama-server best") is not None:
                cells[-1] += f" ({best})"
            over = ", ".join(f"{name} {v:.2f}x" for name, v in row.get("over", {}).items())
            out.append(
                f"| {_machine(r)} | {_run_name(r)}: {r['what']} | {row['in_flight']} | "
                + " | ".join(cells)
                + f" | {over or 'not reported'} |"
            )
    return out


def markdown(runs: list[dict]) -> str:
    """The headline section, its markers included."""
    bench = [r for r in runs if "bench" in r]
    server = [r for r in runs if "server" in r]
    out = [
        BEGIN,
        "",
        "Mainline llama.cpp is llama-cpp-python 0.3.36 as the Makefile builds it; specwise runs "
        "where `--backend auto` put it (ik_llama.cpp on the AMD machines). Every ratio is side by "
        "side within one run (the bench's rotation, or one `bench load` / `bench engines` run), "
        "as that run reported it; the runs' commands and machines are listed below the tables.",
        "",
    ]
    if bench:
        out += ["**One request at a time** (`specwise bench`):", "", *_bench_table(bench), ""]
        cats = _category_table(bench)
        out += ["**By category**, `auto` over mainline plain:", "", *cats, ""] if cats else []
    if server:
        out += ["**Served** (`bench load` / `bench engines`, streamed greedy requests):", ""]
        out += [*_server_table(server), ""]
    out += ["Runs:", ""]
    for r in runs:
        when = f", {r['date']}" if r.get("date") else ""
        note = f" ({r['commit_note']})" if r.get("commit_note") else ""
        cpu = f", {r['cpu']}" if r.get("cpu") else ""
        out.append(
            f'- {r["machine"]} (`lscpu` model name "{r["lscpu"]}"{cpu}), {_run_name(r)}{note}'
            f"{when}: `{r['command']}` (`benchmarks/{r['file']}`)"
        )
    return "\n".join([*out, "", END])


def into(path: Path, text: str) -> None:
    """Replace the headline between its markers in `path` (BENCHMARKS.md) with `text`."""
    doc = Path(path).read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise ValueError(f"{path} has no headline section (a line {BEGIN!r} ... {END!r})")
    Path(path).write_text(pattern.sub(lambda _: text, doc, count=1))
