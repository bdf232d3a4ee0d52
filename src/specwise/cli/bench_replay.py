"""`specwise bench replay`: its flags, the drafter sets replayed over recorded greedy answers
(`bench.replay`) with a progress bar a stage, and the table printed.

Drafters that copy text, and the eagle layer over the bench answers `heads data` keeps with
the target's layer states (every set then replays over those answers, so the sets compare on
the same ones, priced as the target costs where it keeps the states the layer reads); it times
nothing (rounds are priced at this machine's costs).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from specwise.cli.common import UsageError, _drafter_options, _load_models
from specwise.cli.options import _bench_prompts, _csv, _drafter_sets, _model_args
from specwise.drafters import DRAFT_MODEL, READS_STATES

__all__ = ["add_parser"]


def _bench_replay(a: argparse.Namespace) -> int:
    """`bench replay`: record plain greedy answers, replay drafter sets over them (priced)."""
    from tqdm import tqdm

    from specwise.bench import replay
    from specwise.bench.session import default_out
    from specwise.bench.workloads import interleaved, render
    from specwise.costs import calibrated
    from specwise.drafters import make_drafter

    sets = _drafter_sets(a.sets)
    if not sets:
        raise UsageError(f"--sets {a.sets!r} names no drafters; e.g. 'ngram;ngram+suffix'")
    names = list(dict.fromkeys(n for s in sets for n in s))

    def refuse(n: str) -> UsageError:
        return UsageError(
            f"--sets names {n}, which drafts with a model; replay runs the drafters that "
            f"copy text (ngram, suffix, suffix-chain) and the eagle layer: measure {n} with "
            "`specwise bench`"
        )

    for n in names:  # before their options: they need models
        if n in DRAFT_MODEL or (n in READS_STATES and n != "eagle"):
            raise refuse(n)
    if a.max_tokens < 2:
        raise UsageError(f"--max-tokens {a.max_tokens} is invalid; use an integer >= 2")
    extra = _offer_ms(a.offer_ms, names)
    prompts = interleaved(_bench_prompts(a))  # the categories mixed, as a server sees them
    options = _drafter_options(a, names)
    drafters = [make_drafter(n, **options[n]) for n in names]
    for d in drafters:
        if not d.cheap:
            raise refuse(d.name)
    layers: tuple[int, ...] = ()
    if "eagle" in names:
        layers = options["eagle"]["layer"].layers
        recordings = _bench_answers(a, prompts, layers)
    # with the eagle layer, priced as a run that drafts with it loads the target: keeping the
    # states it reads (every set, and plain decoding, at those costs)
    target, _ = _load_models(a, need_draft=False, hidden=layers or False)
    costs = calibrated(target, drafters)
    costs.offer_ms.update(extra)
    out = Path(a.out) if a.out else default_out("-replay")
    bars: list = []

    def progress(desc: str, total: int):
        for bar in bars:  # one bar at a time: the last one's work is done
            bar.close()
        bars.append(tqdm(total=total, desc=desc, unit="req", file=sys.stderr))
        return bars[-1].update

    try:
        if not layers:
            ids = [(p.category, p.id, render(target.tokenizer, p.turns[:1])) for p in prompts]
            recordings = replay.record(
                target, ids, a.max_tokens, progress("recording plain answers", len(ids))
            )
        lines = replay.run(target, recordings, sets, options, costs, out, progress, layers)
    finally:
        for bar in bars:
            bar.close()
    kept = ", the target keeping the layer states the eagle layer reads" if layers else ""
    print(f"speedup over plain decoding, priced at this machine's costs ({target.info.backend}"
          f"{kept}):")
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def _bench_answers(a: argparse.Namespace, prompts: list, layers: tuple[int, ...]) -> list:
    """The recordings a set with the eagle layer replays over: the target's greedy answers to
    `prompts` with its layer states (`specwise heads data` makes them first), in their order,
    each cut to --max-tokens (an answer that ended at once is left out); UsageError naming
    what is missing."""
    from specwise import teacher
    from specwise.backends import resolve_model
    from specwise.bench import replay
    from specwise.drafters.eagle import bench_path

    model = resolve_model(a.target)
    folder = bench_path(model, layers)
    if not teacher.bench_complete(folder):
        raise UsageError(
            f"the eagle layer replays over the target's answers to the bench's prompts with its "
            f"layer states, which {model.name} has none of here yet: `specwise heads data "
            f"--target {a.target}` makes them first"
        )
    data = teacher.Data(folder)
    answered = {m.get("name") for m in data.meta}
    missing = [p.id for p in prompts if p.id not in answered]
    if missing:
        raise UsageError(
            f"no bench answer with layer states for the prompt(s) {', '.join(missing[:3])}: the "
            "eagle layer replays over the shipped prompts' (drop --prompts)"
        )
    by_id = {r.id: r for r in replay.from_bench(data, a.max_tokens)}
    recordings = [by_id[p.id] for p in prompts if p.id in by_id]  # (an empty answer has none)
    if not recordings:
        raise UsageError(
            f"{model.name}'s answers to these prompts ended at once: there is nothing to replay"
        )
    return recordings


def _offer_ms(value: str | None, names: list[str]) -> dict[str, float]:
    """--offer-ms 'NAME=MS,...' -> {NAME: MS}, or UsageError naming what is wrong."""
    out: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in (value or "").split(","))):
        name, _, ms = (x.strip() for x in item.partition("="))
        try:
            out[name] = float(ms)
        except ValueError:
            out[name] = math.nan
        if not name or not 0 <= out[name] < math.inf:
            raise UsageError(
                f"--offer-ms {item!r} is invalid; use NAME=MS with MS a number >= 0, "
                "e.g. eagle=4.3"
            )
        if name not in names:
            raise UsageError(
                f"--offer-ms names {name}, which no set drafts with; use one of "
                f"{', '.join(names)}"
            )
    return out


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """`bench replay` and its flags."""
    bv = bsub.add_parser(
        "replay",
        help="drafter sets and the controller replayed over recorded greedy answers, priced at "
        "this machine's costs, beside what hindsight gets from the same drafts (no timing noise)",
    )
    _model_args(bv)
    bv.add_argument(
        "--sets",
        default="ngram;ngram+suffix",
        help="drafter sets to replay, each as auto over it: sets separated by ';', names in a "
        "set by '+' (drafters that copy text: ngram, suffix, suffix-chain; and eagle, whose "
        "sets replay over the bench answers `heads data` kept with their layer states; "
        "default 'ngram;ngram+suffix')",
    )
    bv.add_argument("--categories", type=_csv(str, "names"), help="categories to run")
    bv.add_argument("--prompts", help="a JSONL file of prompts instead of the shipped ones")
    bv.add_argument("--limit", type=int, help="prompts per category")
    bv.add_argument("--max-tokens", type=int, default=256, help="tokens per answer (256)")
    bv.add_argument(
        "--offer-ms",
        help="what an offer of a cheap drafter costs in the engine beyond its ms a token times "
        "the tokens asked, as the engine learns it (e.g. 'eagle=4.3': the median ms an offer "
        "took in `specwise bench`'s report, less its ms a token times the tokens asked a "
        "round); default: nothing beyond, its own measurement alone",
    )
    bv.add_argument("--out", help="output folder (default bench-results/<timestamp>-replay)")
    bv.set_defaults(func=_bench_replay)
