"""`specwise bench`: its flags and the run of speculative configurations against plain
decoding, and the subcommands that measure one piece of this machine or read a run back:
`backend`, `batch`, `drafts`, `suffix`, `report`, `steps`, and `headline` (BENCHMARKS.md's
headline from the committed run summaries).

It makes `bench`'s subcommand parsers; `bench_replay`, `bench_adapt` and `bench_servers` add
theirs (each subcommand runs its own function), and it imports none of them. It measures
nothing itself: `specwise.bench` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwise.cli.common import (
    UsageError,
    _apply_pair,
    _default_drafters,
    _drafter_options,
    _layer_found,
    _load_drafting,
    _load_models,
)
from specwise.cli.options import _bench_prompts, _csv, _drafter_sets, _k, _model_args
from specwise.drafters import DRAFT_MODEL
from specwise.sampling import SamplingParams

__all__ = ["add_parser", "cmd_bench"]


def _bench_drafters(a: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """(drafters, those run at the numeric k's; None: all) for `bench`. --drafter and
    --fixed-drafter where given; by default `auto` runs over what serve uses by default
    (`_default_drafters`: the eagle layer among them where one is found), and the
    numeric k's run the draft model and the n-gram drafter (the n-gram drafter alone without
    a draft model)."""
    fixed = a.fixed_drafter.split(",") if a.fixed_drafter else None
    if a.drafter:
        return a.drafter.split(","), fixed
    _apply_pair(a)
    draft = bool(a.draft)
    auto = "auto" in (a.k or ["auto"])
    drafters = _default_drafters(draft, auto, auto and _layer_found(a))
    fixed = fixed or (["model", "ngram"] if draft else ["ngram"])
    return list(dict.fromkeys(drafters + fixed)), fixed


def _quick(a: argparse.Namespace) -> None:
    """--quick (what `make demo` runs): one prompt per category, 64 tokens, and k=auto alone
    against plain decoding (and the mainline baseline), which is what its verdict reads; the
    fixed k's are a full run's. Flags given beside it win."""
    if a.quick:
        a.limit = a.limit or 1
        a.max_tokens = a.max_tokens or 64
        a.k = a.k or ["auto"]


def cmd_bench(a: argparse.Namespace) -> int:
    """`bench` without a subcommand: the configurations against plain decoding."""
    from specwise.bench.runner import Options
    from specwise.bench.session import default_out, run_bench
    from specwise.lossy import check_rule

    _quick(a)
    drafters, fixed = _bench_drafters(a)

    def among_drafters(flag: str, value: str, names: list[str]) -> None:
        if set(names) - set(drafters):
            raise UsageError(
                f"{flag} {value} names drafters not in --drafter {','.join(drafters)}; "
                f"pick among those"
            )

    among_drafters("--fixed-drafter", a.fixed_drafter, fixed or [])
    auto_sets = _drafter_sets(a.auto_drafters or "")
    if auto_sets and "auto" not in (a.k or ["auto"]):
        raise UsageError("--auto-drafters needs auto among the --k values")
    among_drafters("--auto-drafters", a.auto_drafters, [n for s in auto_sets for n in s])
    if a.suffix_cache:
        raise UsageError(
            "bench starts every run with an empty suffix memory; --suffix-cache is for "
            "generate and serve"
        )
    options = Options(
        drafters=drafters,
        drafter_options=_drafter_options(a, drafters),
        fixed_drafters=fixed,
        auto_sets=auto_sets,
        ks=a.k or [2, 4, 6, 8, "auto"],
        temperatures=a.temperature,
        top_ps=a.top_p,
        max_tokens=a.max_tokens or 128,
        repeats=a.repeats,
        multi_turn=a.multi_turn,
        seed=a.seed,
        lossy=[check_rule(r) for r in a.acceptance or [] if r != "exact"],
    )
    if options.lossy and not any(t > 0 for t in options.temperatures or [1.0]):
        raise UsageError(
            "--acceptance with a lossy rule needs a sampled run: give --temperature above 0"
        )
    if options.repeats < 1:
        raise UsageError(f"--repeats {options.repeats} is invalid; use an integer >= 1")
    for t in options.temperatures or []:
        SamplingParams(temperature=t)  # validates
    for p in options.top_ps or []:
        SamplingParams(top_p=p)
    prompts = _bench_prompts(a)
    runs_draft = [n for n in drafters if n in DRAFT_MODEL]
    target, draft = _load_drafting(a, drafters, options.drafter_options, bool(runs_draft))
    if runs_draft and draft is None:
        raise UsageError(
            f"the {runs_draft[0]} drafter needs --draft or --pair (or drop it: --drafter ngram)"
        )
    out = Path(a.out) if a.out else default_out()
    info = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "target": target.info.model,
        "draft": draft.info.model if draft else None,
        "backend": target.info.backend,
    }
    baseline = None
    if not a.no_baseline and (a.exact or target.info.backend == "ik_llama"):
        from specwise.backends import load_pair

        # Exact mode: the same target in the default mode, for what exactness costs; else
        # mainline llama.cpp, for what ik_llama gains.
        other = a.backend if a.exact else "llama_cpp"
        baseline, _ = load_pair(target.info.model, None, other, a.threads, 1)
    run_bench(target, draft, prompts, options, out, info, json_line=a.json, baseline=baseline)
    return 0


def _bench_backend(a: argparse.Namespace) -> int:
    from specwise.bench.backend import run_backend_bench

    target, draft = _load_models(a, need_draft=True)
    return run_backend_bench(target, draft, a)


def _bench_batch(a: argparse.Namespace) -> int:
    from specwise.bench.backend import run_batch_bench

    if a.sequences < 2:
        raise UsageError(f"--sequences {a.sequences} is invalid; use an integer >= 2")
    target, _ = _load_models(a, need_draft=False, max_sequences=a.sequences + 1)
    return run_batch_bench(target, a)


def _bench_report(a: argparse.Namespace) -> int:
    from specwise.bench import adapt
    from specwise.bench.session import rebuild

    folder = Path(a.folder)
    if (folder / "meta.json").exists() and not (folder / "rounds.jsonl").exists():
        print("\n".join(adapt.rebuild(folder)))  # a `bench adapt` run
    else:
        rebuild(folder, json_line=a.json)
    return 0


def _bench_headline(a: argparse.Namespace) -> int:
    from specwise.bench import headline

    text = headline.markdown(headline.load(Path(a.source)))
    if a.into:
        headline.into(Path(a.into), text)
        print(f"headline written into {a.into}", file=sys.stderr)
    else:
        print(text)
    return 0


def _bench_steps(a: argparse.Namespace) -> int:
    from specwise.bench.steps import table

    try:
        print("\n".join(table(Path(a.trace))))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 0


def _bench_drafts(a: argparse.Namespace) -> int:
    """`bench drafts`: the draft and its requantized copies, by cost and greedy agreement."""
    from tqdm import tqdm

    from specwise.backends import load, resolve_model
    from specwise.backends.requant import RECIPES, remember_best, split_name
    from specwise.bench import drafts
    from specwise.bench.replay import record
    from specwise.bench.session import default_out
    from specwise.bench.workloads import interleaved, render

    recipes = a.recipes
    for r in recipes:  # before any model loads
        if r not in RECIPES:
            raise UsageError(
                f"--recipes names {r!r}, not a requantization recipe; use some of: "
                f"{', '.join(RECIPES)}"
            )
    if a.max_tokens < 2:
        raise UsageError(f"--max-tokens {a.max_tokens} is invalid; use an integer >= 2")
    _apply_pair(a)
    if not a.draft:
        raise UsageError("bench drafts compares draft models: give --draft or --pair")
    if split_name(a.draft)[1] is not None:
        raise UsageError(
            f"--draft {a.draft}: bench drafts sets a draft beside its requantized copies; "
            f"give the draft itself (--draft {split_name(a.draft)[0]})"
        )
    target, draft = _load_models(a, need_draft=True)
    source = a.draft
    names = [source, *(f"{source}@{r}" for r in recipes)]
    paths = {n: resolve_model(n) for n in names}
    lms = {source: draft}
    for n in names[1:]:
        lms[n] = load(paths[n], target.info.backend, target.info.threads, max_sequences=1)
    prompts = interleaved(_bench_prompts(a))
    ids = [(p.category, p.id, render(target.tokenizer, p.turns[:1])) for p in prompts]
    with tqdm(total=len(ids), desc="target answers", unit="req", file=sys.stderr) as bar:
        recs = record(target, ids, a.max_tokens, bar.update)
    with tqdm(total=len(recs), desc="drafts read them", unit="req", file=sys.stderr) as bar:
        rows, curve = drafts.compare(
            target, lms, recs, {n: paths[n].stat().st_size / 2**20 for n in names}, bar.update
        )
    lines = drafts.table(rows, curve[1])
    top = max(rows, key=lambda r: r.predicted)
    verdict = (
        f"predicted best here: {top.name} (model k={top.best_k}, {top.predicted:.2f}x plain), "
        f"kept as {source}@best; time it: specwise bench --draft {top.name} --k "
        f"{top.best_k},auto"
    )
    remember_best(paths[source], split_name(top.name)[1], verdict)
    lines += ["", verdict]
    out = Path(a.out) if a.out else default_out("-drafts")
    meta = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "target": target.info.model,
        "target_ms": curve,
    }
    drafts.save(out, rows, meta, lines)
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def _bench_suffix(a: argparse.Namespace) -> int:
    from specwise.bench import suffix
    from specwise.bench.session import default_out

    sizes = suffix.DEFAULT_SIZES if a.sizes is None else a.sizes
    if not sizes or min(sizes) < 1000:
        raise UsageError("--sizes needs token counts >= 1000, e.g. 100000,1000000")
    if not a.budget > 0 or a.soak_tokens < 0:
        raise UsageError("--budget needs MiB > 0 and --soak-tokens an integer >= 0")
    out = Path(a.out) if a.out else default_out("-suffix")
    lines = suffix.run(
        sizes, out, a.budget, a.soak_tokens, progress=lambda s: print(s, file=sys.stderr)
    )
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """`bench`, its flags and the subcommands above; returns its subcommands'
    parsers, for the `bench_*` modules to add theirs to."""
    b = sub.add_parser("bench", help="benchmark speculative configurations against plain decoding")
    _model_args(b)
    b.add_argument("--k", type=_csv(_k, "k values"), help="k values, e.g. 2,4,6,8,auto")
    b.add_argument(
        "--fixed-drafter",
        help="run only these drafters at the numeric k values (auto still uses every --drafter; "
        "default without --drafter: the draft model and the n-gram drafter)",
    )
    b.add_argument(
        "--auto-drafters",
        help="more auto configurations beside auto over every --drafter, each over some of "
        "them: sets separated by ';', names in a set by '+', e.g. 'ngram;suffix+model'",
    )
    b.add_argument(
        "--temperature",
        type=_csv(float, "numbers"),
        help="temperatures (default: each category's own)",
    )
    b.add_argument("--top-p", type=_csv(float, "numbers"), help="top-p values")
    b.add_argument(
        "--acceptance",
        type=_csv(str, "rules"),
        help="lossy acceptance rules to measure beside the exact runs, at temperatures > 0, "
        "e.g. typical,top-2: their speed and what they change are reported apart, never in "
        "the exact figures",
    )
    b.add_argument("--categories", type=_csv(str, "names"), help="categories to run")
    b.add_argument("--prompts", help="a JSONL file of prompts instead of the shipped ones")
    b.add_argument("--multi-turn", action="store_true", help="use every turn of 'turns' prompts")
    b.add_argument("--limit", type=int, help="prompts per category")
    b.add_argument("--max-tokens", type=int, help="new tokens per request (default 128)")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", help="output folder (default bench-results/<timestamp>)")
    b.add_argument("--json", action="store_true", help="end stdout with the summary as JSON")
    b.add_argument(
        "--no-baseline",
        action="store_true",
        help="leave out the baseline run by default: plain decoding on mainline llama.cpp "
        "(target on ik_llama), or in the default mode (with --exact)",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="one prompt per category, 64 tokens, k=auto against plain decoding (a few minutes)",
    )
    bsub = b.add_subparsers(dest="bench_command")
    bb = bsub.add_parser(
        "backend", help="plain decoding vs llama-cpp-python, overhead, cost curves"
    )
    _model_args(bb)
    bb.add_argument("--max-tokens", type=int, default=128)
    bb.add_argument("--repeats", type=int, default=3)
    bb.add_argument("--out", help="output folder (default bench-results/<timestamp>-backend)")
    bb.set_defaults(func=_bench_backend)
    bt = bsub.add_parser(
        "batch", help="what batched target calls cost by shape, measured and as the model prices"
    )
    _model_args(bt)
    bt.add_argument("--sequences", type=int, default=8, help="the largest batch (default 8)")
    bt.add_argument("--repeats", type=int, default=5)
    bt.add_argument("--out", help="output folder (default bench-results/<timestamp>-batch)")
    bt.set_defaults(func=_bench_batch)
    br = bsub.add_parser(
        "report",
        help="rebuild report.md, summary.json and plots from a run's JSONL files (of a "
        "`bench adapt` run: report.md and by_request.png)",
    )
    br.add_argument("folder", help="the run's --out folder")
    br.add_argument("--json", action="store_true", help="end stdout with the summary as JSON")
    br.set_defaults(func=_bench_report)
    bh = bsub.add_parser(
        "headline",
        help="BENCHMARKS.md's headline (specwise against mainline llama.cpp and llama-server, "
        "each machine kind measured) as markdown, from the committed run summaries",
    )
    bh.add_argument(
        "--from",
        dest="source",
        default="benchmarks",
        help="the folder of run summaries, one JSON file a run (default benchmarks)",
    )
    bh.add_argument("--into", help="replace the headline section of this file (BENCHMARKS.md)")
    bh.set_defaults(func=_bench_headline)
    bp = bsub.add_parser(
        "steps",
        help="a trace's step accounting: what auto's speculative steps saved, by batch size",
    )
    bp.add_argument("trace", help="a rounds.jsonl (from serve --trace, or a bench run)")
    bp.set_defaults(func=_bench_steps)
    bd = bsub.add_parser(
        "drafts",
        help="the draft model and its requantized copies side by side: cost a token, greedy "
        "agreement with the target, and the speed of model drafting they predict",
    )
    _model_args(bd)
    bd.add_argument(
        "--recipes",
        type=_csv(str, "names"),
        default="q4_0,q5_0",
        help="requantizations of the draft to compare, comma separated (q4_0, q5_0, iq4_nl; "
        "default q4_0,q5_0)",
    )
    bd.add_argument("--categories", type=_csv(str, "names"), help="categories to run")
    bd.add_argument("--prompts", help="a JSONL file of prompts instead of the shipped ones")
    bd.add_argument("--limit", type=int, default=1, help="prompts per category (default 1)")
    bd.add_argument("--max-tokens", type=int, default=96, help="tokens per answer (96)")
    bd.add_argument("--out", help="output folder (default bench-results/<timestamp>-drafts)")
    bd.set_defaults(func=_bench_drafts)
    bs = bsub.add_parser("suffix", help="the suffix drafter's memory: build, add and lookup cost")
    bs.add_argument(
        "--sizes",
        type=_csv(int, "integers"),
        help="memory sizes in tokens (default 100000,1000000,5000000,25000000: 25M tokens is "
        "about 100 MB of text)",
    )
    bs.add_argument("--budget", type=float, default=64.0, help="MiB of the soak's memory (64)")
    bs.add_argument(
        "--soak-tokens",
        type=int,
        default=40_000_000,
        help="tokens added to that memory, a request's worth at a time (40M)",
    )
    bs.add_argument("--out", help="output folder (default bench-results/<timestamp>-suffix)")
    bs.set_defaults(func=_bench_suffix)
    b.set_defaults(func=cmd_bench)
    return bsub
