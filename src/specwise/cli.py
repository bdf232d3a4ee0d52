"""The `specwise` command: parses arguments, builds configs, calls the library, prints results.

Thin by design: no decoding, measuring or model logic lives here. Bad input ends with one
sentence on stderr (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from specwise.backends import BACKENDS
from specwise.drafters import DRAFT_MODEL, READS_STATES
from specwise.drafters.suffix import SCOPES
from specwise.sampling import SamplingParams
from specwise.server.scheduler import PREFILL_CHUNK, WHOLE_PROMPT

__all__ = ["main"]


TARGET_HELP = (
    "target model: catalog name, .gguf file, HF folder, or ollama:NAME[:TAG] (a model of "
    "Ollama's store, run in place; `models list` shows those found)"
)


class UsageError(Exception):
    """Bad input from the command line; printed as one sentence."""


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _params(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        min_p=a.min_p,
        seed=a.seed,
        max_tokens=a.max_tokens,
        stop=tuple(a.stop),
    )


def _heads_target_args(p: argparse.ArgumentParser) -> None:
    """The target of a command about its drafting heads (no draft model, never exact)."""
    p.add_argument("--pair", help="catalog pair whose target the heads are for")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto")
    p.add_argument("--threads", type=int, help="threads (default: the cores)")
    p.set_defaults(draft=None, exact=False)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", help="catalog pair: sets --target and --draft (see `models list`)")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument(
        "--draft",
        help="draft model (catalog name, path or ollama:NAME[:TAG]); with another tokenizer "
        "than the target's it drafts on the tokens both share",
    )
    p.add_argument(
        "--drafter",
        help="drafters, comma separated (model, ngram, suffix, suffix-chain, heads, eagle); default "
        "with --k "
        "auto: ngram "
        "and suffix, plus model with --draft; with a fixed k: model with --draft, else ngram",
    )
    p.add_argument(
        "--suffix-scope",
        choices=SCOPES,
        default="key",
        help="what the suffix drafter remembers across requests: nothing, each API key's own "
        "requests (default), or every request",
    )
    p.add_argument(
        "--suffix-budget",
        type=float,
        default=256.0,
        help="MiB the suffix drafter's memory of earlier requests may hold (default 256)",
    )
    p.add_argument(
        "--suffix-branches",
        type=int,
        default=3,
        help="most continuations the suffix drafter offers after a token, as a tree, where "
        "the backend scores trees in one call (ik_llama; default 3; 1: chains only)",
    )
    p.add_argument(
        "--suffix-cache",
        help="keep the suffix drafter's memory in this file across runs (read at start, "
        "written at exit)",
    )
    p.add_argument(
        "--backend",
        choices=["auto", *BACKENDS],
        default="auto",
        help="auto (default): torch for a HF folder; for GGUF the llama.cpp library measured "
        "fastest on this machine (ik_llama or llama_cpp)",
    )
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: cores)")
    p.add_argument(
        "--exact",
        action="store_true",
        help="bit-exact mode: greedy output equals plain one-request decoding bit for bit, "
        "whatever the drafter, k or other requests (slower; GGUF on mainline llama.cpp goes "
        "a forward a token, where speculation cannot pay)",
    )


def _k(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--k {value!r} is invalid; use an integer >= 0 (0: plain) or auto"
        ) from None
    if k < 0:
        raise argparse.ArgumentTypeError(
            f"--k {k} is invalid; use an integer >= 0 (0: plain) or auto"
        )
    return k


def _default_drafters(draft: bool, auto: bool) -> list[str]:
    """The drafters used where --drafter is not given: with k=auto the n-gram and suffix
    drafters, plus the draft model when there is one; with a fixed k the draft model if there
    is one, else the n-gram drafter. The bench's `auto` runs over the same set."""
    if auto:
        return ["ngram", "suffix", "model"] if draft else ["ngram", "suffix"]
    return ["model"] if draft else ["ngram"]


def _drafter_names(a: argparse.Namespace) -> list[str]:
    """The drafters asked for: --drafter a,b, else `_default_drafters` (the draft model's text
    drafter, model-text, is added by `_build_engine` once both models are loaded, where its
    tokenizer is not the target's)."""
    if a.drafter:
        names = [n.strip() for n in a.drafter.split(",") if n.strip()]
    else:
        names = _default_drafters(bool(a.draft), a.k == "auto")
    from specwise.drafters import DRAFTERS

    for n in names:
        if n not in DRAFTERS:
            raise UsageError(
                f"--drafter {n!r} is unknown; known drafters: {', '.join(sorted(DRAFTERS))}"
            )
    if len(names) > 1 and a.k != "auto":
        raise UsageError(f"a fixed --k uses one drafter, got {','.join(names)}; use --k auto")
    runs_draft = [n for n in names if n in DRAFT_MODEL]
    if runs_draft and not a.draft:
        raise UsageError(f"--drafter {runs_draft[0]} needs --draft PATH (a draft model)")
    if a.draft and not runs_draft:
        raise UsageError(f"--draft was given but --drafter {a.drafter} does not use it")
    return names


def _load_models(
    a: argparse.Namespace, need_draft: bool, max_sequences: int = 1, hidden: bool | tuple = False
):
    """(target LM, draft LM or None) from --pair / --target / --draft (default: the default pair).
    max_sequences: sequences decoded at once (1 for a command that runs one request at a time);
    hidden: the target keeps its hidden states (True: the final one, for the heads drafter;
    layer indices: those layers', for the eagle drafter)."""
    from specwise.backends import load_pair

    _apply_pair(a)
    if not a.target:
        raise UsageError("--target is required (a catalog name, a .gguf file or a HF folder)")
    draft = a.draft if need_draft else None
    return load_pair(
        a.target, draft, a.backend, a.threads, max_sequences, exact=a.exact, hidden=hidden
    )


def _drafter_options(a: argparse.Namespace, names: list[str]) -> dict[str, dict]:
    """The options of each named drafter but the model drafter (whose LM comes with the models),
    from --suffix-scope/-budget/-branches, and the heads trained for the target; checked now,
    before any model loads, by building each drafter once."""
    from specwise.drafters import make_drafter

    suffix = {"scope": a.suffix_scope, "budget_mib": a.suffix_budget}
    given = {"suffix": {**suffix, "branches": a.suffix_branches}, "suffix-chain": suffix}
    if "heads" in names:
        given["heads"] = {"heads": _trained(a, "heads")}
    if "eagle" in names:
        given["eagle"] = {"layer": _trained(a, "eagle")}
    options = {n: given.get(n, {}) for n in names if n not in DRAFT_MODEL}
    for n, o in options.items():
        make_drafter(n, **o)
    return options


def _trained(a: argparse.Namespace, arch: str):
    """The drafter network for the target: the heads trained here (`specwise heads train`),
    or the eagle drafter's layer trained here or shipped with specwise for it (`eagle.find`);
    else UsageError."""
    from specwise.backends import resolve_model
    from specwise.drafters import eagle
    from specwise.drafters.heads import Heads, heads_path

    _apply_pair(a)
    model = resolve_model(a.target)
    if arch == "eagle":
        path = eagle.find(model)
        if path is None:
            raise UsageError(
                f"no drafting layer is trained for {model.name} here and none ships for it; "
                f"make one with `specwise heads data --target {a.target}` then `specwise heads "
                f"train --target {a.target} --arch eagle`, or drop eagle from --drafter"
            )
        return eagle.Layer.load(path)
    path = heads_path(model) / "heads.pt"
    if not path.exists():
        raise UsageError(
            f"no drafting heads are trained for {model.name} here; train with `specwise heads "
            f"train --target {a.target}` (about 30 minutes), or drop heads from --drafter"
        )
    return Heads.load(path)


def _hidden(names: Sequence[str], options: dict[str, dict]) -> bool | tuple[int, ...]:
    """What the target keeps of its states for the named drafters: the layers the eagle
    drafter's layer reads, the final state for the heads (not both: UsageError), or nothing."""
    if "eagle" in names and "heads" in names:
        raise UsageError(
            "--drafter names heads and eagle: they read different states of the target (the "
            "final one, and three layers'); name one of them"
        )
    if "eagle" in names:
        return options["eagle"]["layer"].layers
    return "heads" in names


def _build_engine(a: argparse.Namespace, trace=None, max_sequences: int = 1):
    from specwise.backends.base import check_same_vocab
    from specwise.drafters import make_drafters
    from specwise.engine import Engine

    _apply_pair(a)
    names = _drafter_names(a)
    adapts = _adapted_drafter(a, names)
    options = _drafter_options(a, names)
    adapter = _adapter(a, adapts, options)
    need_draft = any(n in DRAFT_MODEL for n in names)
    target, draft = _load_models(
        a,
        need_draft=need_draft,
        max_sequences=max_sequences,
        hidden=_hidden(names, options),
    )
    if draft is not None and a.k == "auto" and not a.drafter and draft.tokenizer is not None:
        try:
            check_same_vocab(target, draft)
        except ValueError:  # another tokenizer: the controller may also draft its text
            names.append("model-text")
    drafters = make_drafters(names, draft, options)
    if a.suffix_cache and "suffix" in names and Path(a.suffix_cache).exists():
        next(d for d in drafters if d.name == "suffix").load(a.suffix_cache)
    controller = None
    if a.k == "auto":
        from specwise.controller import Controller

        controller = Controller.calibrated(target, drafters)
    engine = Engine(target, drafters, k=a.k, trace=trace, controller=controller, learner=adapter)
    for d in drafters:  # what binding found, e.g. a draft model with another tokenizer
        if getattr(d, "note", None):
            print(f"specwise: {d.name} drafter: {d.note}", file=sys.stderr)
    return engine


def _adapted_drafter(a: argparse.Namespace, names: list[str]) -> str | None:
    """The drafter serve --adapt adapts (heads or eagle; None when off), or UsageError."""
    mode = getattr(a, "adapt", "off")  # only serve has --adapt
    if mode == "off":
        return None
    learners = [n for n in ("heads", "eagle") if n in names]
    if len(learners) != 1:
        raise UsageError(
            f"--adapt {mode} adapts one drafter on hidden states, heads or eagle; name "
            f"{'one of them, not both,' if learners else 'it'} in --drafter (e.g. --drafter "
            f"eagle, or --k auto --drafter ngram,suffix,heads)"
        )
    return learners[0]


def _adapter(a: argparse.Namespace, name: str | None, options: dict[str, dict]):
    """The `Adapter` of serve --adapt for drafter `name` (None when off), given to its
    options."""
    if name is None:
        return None
    from specwise.adapt import Adapter

    net = options[name]["heads" if name == "heads" else "layer"]
    adapter = Adapter(
        net,
        scope=a.adapt,
        budget=a.adapt_budget,
        idle_budget=a.adapt_idle_budget,
        capacity=a.adapt_buffer,
    )
    if a.adapt_cache:
        try:
            taken = adapter.load(a.adapt_cache)
        except ValueError as exc:
            raise UsageError(f"--adapt-cache: {exc}") from None
        if taken:
            print(
                f"specwise: {taken} adapted {'copy' if taken == 1 else 'copies'} of the "
                f"{name} drafter from {a.adapt_cache}",
                file=sys.stderr,
            )
    options[name]["adapter"] = adapter
    return adapter


def _save_memory(a: argparse.Namespace, engine) -> None:
    """Write what the run learnt: the controller's averages (k auto) to $SPECWISE_HOME, the
    suffix drafter's memory to --suffix-cache and the adapted drafter to --adapt-cache if
    given."""
    if engine.controller is not None:
        engine.controller.save()
    d = next((d for d in engine.drafters if d.name == "suffix"), None)
    if a.suffix_cache and d is not None:
        d.save(a.suffix_cache)
    if getattr(a, "adapt_cache", None) and engine.learner is not None:
        engine.learner.save(a.adapt_cache)


def _csv(convert, what: str):
    def parse(value: str) -> list:
        try:
            return [convert(x.strip()) for x in value.split(",") if x.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a comma-separated list of {what}"
            ) from None

    return parse


def _servers(value: str) -> dict[str, str]:
    """--url: a server's URL, or several as NAME=URL,NAME=URL (named by host:port without a
    name) -> {name: URL}; one server alone is named ""."""
    from urllib.parse import urlsplit

    parts = [p.strip() for p in value.split(",") if p.strip()]
    out: dict[str, str] = {}
    for p in parts:
        name, sep, url = p.partition("=")
        if not sep or "://" in name:
            name, url = "", p
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--url {url!r} is not an http(s) URL")
        name = name or (urlsplit(url).netloc if len(parts) > 1 else "")
        if name in out:
            raise UsageError(f"--url names the server {name!r} twice; name each one once")
        out[name] = url
    if not out:
        raise UsageError("--url needs a server's URL, e.g. http://127.0.0.1:8000")
    return out


def _bench_load(a: argparse.Namespace) -> int:
    import os

    from specwise.bench.load import LoadOptions, Slo, run_load, run_soak
    from specwise.bench.session import default_out
    from specwise.bench.workloads import builtin, interleaved, load_jsonl

    if a.requests < 1:
        raise UsageError(f"--requests {a.requests} is invalid; use an integer >= 1")
    if a.rounds < 1:
        raise UsageError(f"--rounds {a.rounds} is invalid; use an integer >= 1")
    if a.rate is not None and a.concurrency is not None:
        raise UsageError("--rate (an open loop) and --concurrency (a closed one): give one")
    concurrency = [1, 2, 4, 8] if a.concurrency is None else a.concurrency
    if not concurrency or min(concurrency) < 1:
        raise UsageError("--concurrency needs integers >= 1, e.g. 1,2,4,8")
    if a.rate is not None and (not a.rate or min(a.rate) <= 0):
        raise UsageError(f"--rate {a.rate} is invalid; use requests per second > 0, e.g. 0.1,0.2")
    if a.rate is not None and not a.stream:
        raise UsageError("--rate measures TTFT and the SLO, which need --stream")
    if not (a.slo_ttft > 0 and a.slo_tpot > 0 and 0 < a.slo_target <= 1):
        raise UsageError(
            f"--slo-ttft {a.slo_ttft:g} / --slo-tpot {a.slo_tpot:g} / --slo-target "
            f"{a.slo_target:g} is invalid; use seconds > 0 and a share in (0, 1]"
        )
    urls = _servers(a.url)
    prompts = interleaved(load_jsonl(a.prompts) if a.prompts else builtin(a.categories))
    opts = LoadOptions(
        urls=urls,
        model=a.model,
        concurrency=concurrency,
        requests=a.requests,
        prompts=[p.turns[0] for p in prompts],
        stream=a.stream,
        max_tokens=a.max_tokens,
        ks=a.k or [None],
        api_key=a.api_key or os.environ.get("SPECWISE_API_KEY"),
        rounds=a.rounds,
        rates=a.rate or [],
        slo=Slo(a.slo_ttft, a.slo_tpot, a.slo_target),
        seed=a.seed,
        out=Path(a.out) if a.out else default_out("-load"),
    )
    if a.soak is None:
        if a.faults is not None or a.alone:
            raise UsageError("--faults and --alone go with --soak")
        run_load(opts)
        return 0
    if a.faults is not None and not a.faults > 0:
        raise UsageError(f"--faults {a.faults:g} is invalid; use seconds > 0, e.g. --faults 5")
    if a.soak <= 0 or a.sample_every <= 0:
        raise UsageError(
            f"--soak {a.soak:g} / --sample-every {a.sample_every:g} is invalid; "
            "use seconds > 0, e.g. --soak 3600 --sample-every 60"
        )
    if opts.rates:
        raise UsageError("--soak keeps workers busy (a closed loop); give no --rate with it")
    if len(opts.concurrency) > 1 or len(opts.settings()) > 1:
        raise UsageError(
            "--soak keeps one level busy: give one --url, one --concurrency and at most one --k"
        )
    result = run_soak(opts, a.soak, a.sample_every, fault_every=a.faults, alone=a.alone)
    return 0 if all(c["ok"] for c in result["checks"]) else 1


def _check_budgets(serving: tuple[str, float], idle: tuple[str, float]) -> None:
    """The adaptation's shares of one core, while requests are in and while none is, or
    UsageError naming the flag."""
    (flag, x), (idle_flag, y) = serving, idle
    if not 0 <= x <= 1:
        raise UsageError(
            f"{flag} {x:g} is invalid; use a share of one core, 0 <= x <= 1 (0: only while idle)"
        )
    if not 0 < y <= 1:
        raise UsageError(f"{idle_flag} {y:g} is invalid; use a share of one core, 0 < x <= 1")


def _bench_adapt(a: argparse.Namespace) -> int:
    from specwise.bench import adapt
    from specwise.bench.session import default_out

    if a.requests < 1 or not 1 <= a.k <= 8 or a.max_tokens < 1:
        raise UsageError("--requests and --max-tokens need integers >= 1, --k an integer 1..8")
    _check_budgets(("--budget", a.budget), ("--idle-budget", a.idle_budget))
    if a.think < 0:
        raise UsageError(f"--think {a.think:g} is invalid; use seconds >= 0")
    if a.temperature < 0:
        raise UsageError(f"--temperature {a.temperature:g} is invalid; use >= 0")
    net = _trained(a, a.drafter)
    hidden = net.layers if a.drafter == "eagle" else True
    target, _ = _load_models(a, need_draft=False, hidden=hidden)
    out = Path(a.out) if a.out else default_out("-adapt")
    lines = adapt.run(
        target,
        net,
        out,
        requests=a.requests,
        k=a.k,
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        budget=a.budget,
        idle_budget=a.idle_budget,
        think=a.think,
        progress=lambda s: print(f"specwise: {s}", file=sys.stderr),
    )
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def _bench_engines(a: argparse.Namespace) -> int:
    from specwise.bench.engines import ENGINES, EnginesOptions, run_engines
    from specwise.bench.session import default_out
    from specwise.bench.workloads import builtin, interleaved, load_jsonl
    from specwise.engines.llama_server import MODES
    from specwise.models import CATALOG, PAIRS

    if a.pair not in PAIRS:
        raise UsageError(f"--pair {a.pair!r} is unknown; known pairs: {', '.join(PAIRS)}")
    target, draft = a.target or PAIRS[a.pair].target, a.draft or PAIRS[a.pair].draft
    for flag, name in (("--target", target), ("--draft", draft)):
        if name not in CATALOG:
            raise UsageError(
                f"{flag} {name!r} is not a catalog model; use one of {', '.join(CATALOG)}"
            )
    unknown = [e for e in a.engines if e not in ENGINES]
    if unknown or not a.engines:
        raise UsageError(
            f"--engines {','.join(a.engines)!r} is invalid; use some of {', '.join(ENGINES)} "
            "(and --url NAME=URL for servers already running)"
        )
    modes = a.llama_server_modes or list(MODES)
    if [m for m in modes if m not in MODES] or "none" not in modes:
        raise UsageError(
            f"--llama-server-modes {','.join(modes)!r} is invalid; use some of "
            f"{', '.join(MODES)}, 'none' among them (the baseline)"
        )
    for flag, n in (("--requests", a.requests), ("--rounds", a.rounds), ("--limit", a.limit)):
        if n is not None and n < 1:
            raise UsageError(f"{flag} {n} is invalid; use an integer >= 1")
    if not a.concurrency or min(a.concurrency) < 1:
        raise UsageError("--concurrency needs integers >= 1, e.g. 1,2,4")
    if a.max_tokens < 1:
        raise UsageError(f"--max-tokens {a.max_tokens} is invalid; use an integer >= 1")
    ks = a.k or ["auto", 0]
    if "specwise" in a.engines and 0 not in ks:
        raise UsageError(f"--k {a.k} needs 0 among its values (specwise's own plain decoding)")
    prompts = load_jsonl(a.prompts) if a.prompts else builtin(a.categories)
    if a.limit is not None:
        from specwise.bench.session import pick

        prompts = pick(prompts, a.limit)
    opts = EnginesOptions(
        target=target,
        draft=draft,
        pair=a.pair if (target, draft) == (PAIRS[a.pair].target, PAIRS[a.pair].draft) else None,
        engines=a.engines,
        prompts=[p.turns[0] for p in interleaved(prompts)],
        out=Path(a.out) if a.out else default_out("-engines"),
        concurrency=a.concurrency,
        ks=sorted(ks, key=lambda k: k == 0),
        modes=modes,
        urls=_servers(a.url) if a.url else {},
        requests=a.requests,
        rounds=a.rounds,
        max_tokens=a.max_tokens,
        backend=a.backend,
        api_key=a.api_key,
    )
    run_engines(opts)
    return 0


def cmd_recommend(a: argparse.Namespace) -> int:
    from specwise.engines.configs import recommend

    path = Path(a.run) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UsageError(
            f"{a.run!r} has no readable summary.json; give the folder of a "
            "`specwise bench engines` run"
        ) from None
    if "comparisons" not in summary:
        raise UsageError(f"{a.run!r} is not a `specwise bench engines` run (no comparisons)")
    level = str(a.concurrency) if a.concurrency is not None else None
    out = recommend(summary, a.engine, level)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(out["text"])
    if "note" in out:
        print(out["note"])
    print(out["command"])
    return 0


def _bench_prompts(a: argparse.Namespace) -> list:
    """The prompts a bench command runs: --prompts (or the shipped ones), --categories, at most
    --limit per category; UsageError when none are left."""
    from specwise.bench.session import pick
    from specwise.bench.workloads import builtin, load_jsonl

    prompts = load_jsonl(a.prompts) if a.prompts else builtin(a.categories)
    if a.prompts and a.categories:
        prompts = [p for p in prompts if p.category in a.categories]
    prompts = pick(prompts, a.limit)
    if not prompts:
        raise UsageError("no prompts left to run (check --categories and --prompts)")
    return prompts


def _drafter_sets(value: str) -> list[list[str]]:
    """'a;b+c' -> [[a], [b, c]]: sets separated by ';', names in a set by '+'."""
    sets = [[n.strip() for n in s.split("+") if n.strip()] for s in value.split(";")]
    return [s for s in sets if s]


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
            f"copy text (ngram, suffix, suffix-chain): measure {n} with `specwise bench`"
        )

    for n in names:
        if n in DRAFT_MODEL or n in READS_STATES:  # before their options: they need models
            raise refuse(n)
    options = _drafter_options(a, names)
    drafters = [make_drafter(n, **options[n]) for n in names]
    for d in drafters:
        if not d.cheap:
            raise refuse(d.name)
    if a.max_tokens < 2:
        raise UsageError(f"--max-tokens {a.max_tokens} is invalid; use an integer >= 2")
    prompts = interleaved(_bench_prompts(a))  # the categories mixed, as a server sees them
    target, _ = _load_models(a, need_draft=False)
    costs = calibrated(target, drafters)
    ids = [(p.category, p.id, render(target.tokenizer, p.turns[:1])) for p in prompts]
    out = Path(a.out) if a.out else default_out("-replay")
    bars: list = []

    def progress(desc: str, total: int):
        for bar in bars:  # one bar at a time: the last one's work is done
            bar.close()
        bars.append(tqdm(total=total, desc=desc, unit="req", file=sys.stderr))
        return bars[-1].update

    try:
        lines = replay.run(target, ids, sets, options, costs, a.max_tokens, out, progress)
    finally:
        for bar in bars:
            bar.close()
    print(f"speedup over plain decoding, priced at this machine's costs ({target.info.backend}):")
    print("\n".join(lines))
    print(f"written to {out}", file=sys.stderr)
    return 0


def _bench_drafters(a: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """(drafters, those run at the numeric k's; None: all) for `bench`. --drafter and
    --fixed-drafter where given; by default `auto` runs over what generate and serve use by
    default (`_default_drafters`), and the numeric k's run the draft model and the n-gram
    drafter (the n-gram drafter alone without a draft model)."""
    fixed = a.fixed_drafter.split(",") if a.fixed_drafter else None
    if a.drafter:
        return a.drafter.split(","), fixed
    _apply_pair(a)
    draft = bool(a.draft)
    drafters = _default_drafters(draft, "auto" in (a.k or ["auto"]))
    fixed = fixed or (["model", "ngram"] if draft else ["ngram"])
    return list(dict.fromkeys(drafters + fixed)), fixed


def cmd_bench(a: argparse.Namespace) -> int:
    from specwise.bench.runner import Options
    from specwise.bench.session import default_out, run_bench
    from specwise.lossy import check_rule

    if a.bench_command == "load":
        return _bench_load(a)
    if a.bench_command == "engines":
        return _bench_engines(a)
    if a.bench_command == "steps":
        from specwise.bench.steps import table

        try:
            print("\n".join(table(Path(a.trace))))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return 0
    if a.bench_command == "report":
        from specwise.bench import adapt
        from specwise.bench.session import rebuild

        folder = Path(a.folder)
        if (folder / "meta.json").exists() and not (folder / "rounds.jsonl").exists():
            print("\n".join(adapt.rebuild(folder)))  # a `bench adapt` run
        else:
            rebuild(folder, json_line=a.json)
        return 0
    if a.bench_command == "batch":
        from specwise.bench.backend import run_batch_bench

        if a.sequences < 2:
            raise UsageError(f"--sequences {a.sequences} is invalid; use an integer >= 2")
        target, _ = _load_models(a, need_draft=False, max_sequences=a.sequences + 1)
        return run_batch_bench(target, a)
    if a.bench_command == "suffix":
        from specwise.bench import suffix

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
    if a.bench_command == "adapt":
        return _bench_adapt(a)
    if a.bench_command == "replay":
        return _bench_replay(a)
    if a.bench_command == "backend":
        from specwise.bench.backend import run_backend_bench

        target, draft = _load_models(a, need_draft=True)
        return run_backend_bench(target, draft, a)
    if a.quick:
        a.limit = a.limit or 1
        a.max_tokens = a.max_tokens or 64
        a.k = a.k or [4, "auto"]
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
    target, draft = _load_models(
        a, need_draft=bool(runs_draft), hidden=_hidden(drafters, options.drafter_options)
    )
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


def _apply_pair(a: argparse.Namespace) -> None:
    """--pair NAME fills --target and --draft (explicit flags win); with neither --target nor
    --pair, the default pair does."""
    from specwise.models import DEFAULT_PAIR, PAIRS

    if not a.target and not a.pair:
        a.pair = DEFAULT_PAIR
    if not a.pair:
        return
    pair = PAIRS.get(a.pair)
    if pair is None:
        raise UsageError(f"--pair {a.pair!r} is unknown; known pairs: {', '.join(PAIRS)}")
    a.target = a.target or pair.target
    wanted = getattr(a, "drafter", None)
    if wanted is None or set(DRAFT_MODEL) & set(wanted.split(",")):
        a.draft = a.draft or pair.draft


def cmd_models(a: argparse.Namespace) -> int:
    from specwise import models

    if a.models_command == "list":
        print(f"{'name':32} {'role':7} {'size':>9}  {'pulled':6}  description")
        for e in models.CATALOG.values():
            size = f"{e.size / 2**20:.0f} MiB" if e.size else "?"
            pulled = "yes" if models.is_pulled(e.name) else "no"
            print(f"{e.name:32} {e.role:7} {size:>9}  {pulled:6}  {e.description}")
        print()
        for p in models.PAIRS.values():
            default = " (default)" if p.name == models.DEFAULT_PAIR else ""
            print(f"pair {p.name}{default}: target {p.target} + draft {p.draft}")
        print(f"\ncache: {models.home() / 'models'}")
        print("\n".join(_found_lines()))
    elif a.models_command == "pull":
        path = models.pull(a.name, source=a.source)
        print(path)
    elif a.models_command == "path":
        if a.name in models.PAIRS:
            raise UsageError(f"{a.name!r} is a pair; ask for one model: `models path NAME`")
        if a.name.startswith("ollama:"):
            from specwise.stores import resolve_ollama

            print(resolve_ollama(a.name).path)
        else:
            print(models.resolve(a.name, pull_missing=False))
    return 0


def _found_lines() -> list[str]:
    """`models list`'s second part: the GGUF models of Ollama, LM Studio and the Hugging Face
    cache on this machine, each with what runs it and the draft to try with it."""
    from specwise.stores import discover, hf_cache_root, suggest_draft

    stores, missing = discover()
    found = [m for st in stores for m in st.models]
    lines = ["", "GGUF models already on this machine (read from their headers, never copied):"]
    lines += [f"  {sentence}" for sentence in missing]
    for st in stores:
        n = len(st.models)
        lines.append(f"{st.kind} ({st.root}): {n or 'no'} model{'' if n == 1 else 's'}")
        for m in st.models:
            h = m.header
            lines.append(
                f"  {m.name:40} {m.size / 2**30:6.2f} GiB  {h.file_type or '?':8} "
                f"{h.parameter_size:>6}  {h.architecture:10} tokenizer {h.tokenizer_family}"
            )
            advice = suggest_draft(m, found)
            lines.append(f"      --target {m.ref}  ·  draft: {advice.flags}: {advice.why}")
        lines += [f"  ! {p}" for p in st.problems]
    kinds = {st.kind for st in stores}
    looked = {
        "ollama": "OLLAMA_MODELS, ~/.ollama/models, /usr/share/ollama/.ollama/models",
        "lm-studio": "~/.lmstudio/models, ~/.cache/lm-studio/models",
        "hf-cache": str(hf_cache_root()),
    }
    lines += [
        f"{k}: none found (looked in {where})" for k, where in looked.items() if k not in kinds
    ]
    return lines


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def describe(result, engine) -> list[str]:
    """The human summary of one generation; every acceptance figure says what it is."""
    from collections import Counter

    from specwise.trace import choice_shares

    s = result.summary
    active = engine.drafters if engine.k != 0 else []
    dname = ",".join(d.name for d in active) or "none (plain)"
    k_label = "chosen per round: auto" if engine.k == "auto" else f"k={engine.k}"
    spent = s.draft_ms + s.verify_ms + s.overhead_ms
    share = (lambda v: f"{100 * v / spent:.0f}%") if spent else (lambda v: "n/a")
    lines = [
        f"target {engine.target.info.model} ({engine.target.info.backend}) · drafter {dname} · "
        f"k={engine.k} · finish: {result.finish_reason}",
        f"emitted {s.emitted} tokens in {s.rounds} rounds · proposed {s.proposed} · "
        f"accepted {s.accepted}",
        f"acceptance rate (Σ accepted / Σ proposed, {k_label}): {_fmt(s.acceptance_rate)}",
        f"mean accepted length τ (Σ emitted / rounds, plain = 1): {_fmt(s.mean_accepted_length)}",
        "α per position (conditional): "
        + (" ".join(_fmt(a, ".2f") for a in s.alpha_per_position) or "n/a"),
        "acceptance per position (unconditional): "
        + (" ".join(_fmt(a, ".2f") for a in s.acceptance_per_position) or "n/a"),
        f"TTFT {_fmt(s.ttft_ms, '.0f')} ms · continuation {_fmt(s.continuation_tokens_per_s, '.1f')}"
        f" tokens/s · total {s.total_ms:.0f} ms · goodput {_fmt(s.goodput_tokens_per_ms, '.4f')}"
        f" tokens/ms",
        f"time in rounds: draft {share(s.draft_ms)} · verify {share(s.verify_ms)} · overhead "
        f"{share(s.overhead_ms)} · prefill {s.prefill_ms:.0f} ms · peak RSS {s.peak_rss_mb:.0f} MB",
    ]
    if s.acceptance != "exact":
        lines.insert(
            0,
            f"LOSSY acceptance rule {s.acceptance!r}: this output is NOT a sample of the "
            f"target's distribution (specwise.lossy says which one it is)",
        )
    if engine.k == "auto" and result.rounds:
        shares = choice_shares(result.rounds)
        parts = [
            f"{name} in {100 * v['share']:.0f}% of rounds"
            + (f" (mean k {v['mean_k']:.1f})" if name != "plain" else "")
            for name, v in sorted(shares.items(), key=lambda kv: -kv[1]["share"])
        ]
        why = Counter(r.decision for r in result.rounds if r.decision).most_common(1)
        lines.append("auto: " + ", ".join(parts) + (f"; most often: {why[0][0]}" if why else ""))
    for d in active:
        note = getattr(d, "note", None)
        if note:
            lines.append(f"note: {note}")
    return lines


def cmd_generate(a: argparse.Namespace) -> int:
    from specwise.trace import JsonlSink

    params = _params(a)
    prompt_text = sys.stdin.read() if a.prompt == "-" else a.prompt
    if not prompt_text:
        raise UsageError("the prompt is empty; give the prompt text (or - to read stdin)")
    sink = JsonlSink(a.trace) if a.trace else None
    try:
        engine = _build_engine(a, trace=sink)
        tok = engine.target.tokenizer
        if tok is None:
            raise UsageError(f"the target {a.target!r} has no tokenizer; text prompts need one")
        if a.chat:
            ids = tok.render_chat([{"role": "user", "content": prompt_text}])
        else:
            ids = tok.encode(prompt_text)
        req = engine.start(  # a trace shows its text
            ids, params, inspect=sink is not None, acceptance=a.acceptance
        )
        try:
            while True:
                if not a.json and req.detok is not None:
                    print(req.detok.take(), end="", flush=True)
                if req.done:
                    break
                engine.step([req])
        finally:
            result = engine.finish(req)
        _save_memory(a, engine)
    finally:
        if sink is not None:
            sink.close()
    if a.json:
        out = {
            "text": result.text,
            "tokens": result.tokens,
            "finish_reason": result.finish_reason,
            "summary": result.summary.to_dict(),
        }
        print(json.dumps(out))
    else:
        print(req.detok.take(final=True) if req.detok is not None else "")
        print("---")
        print("\n".join(describe(result, engine)))
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    if a.max_batch < 1:
        raise UsageError(f"--max-batch {a.max_batch} is invalid; use an integer >= 1")
    if a.max_queue < 0:
        raise UsageError(f"--max-queue {a.max_queue} is invalid; use an integer >= 0")
    if a.prefill_chunk < 0:
        raise UsageError(
            f"--prefill-chunk {a.prefill_chunk} is invalid; use tokens >= 1, or 0 for whole prompts"
        )
    for flag in ("whole_prompt", "max_prompt", "max_new_tokens", "streams_per_key"):
        if getattr(a, flag) < 0:
            name = "--" + flag.replace("_", "-")
            raise UsageError(f"{name} {getattr(a, flag)} is invalid; use an integer >= 0")
    if not a.max_body_mb > 0:
        raise UsageError(f"--max-body-mb {a.max_body_mb:g} is invalid; use MiB > 0")
    _check_budgets(("--adapt-budget", a.adapt_budget), ("--adapt-idle-budget", a.adapt_idle_budget))
    if a.adapt_buffer < 1:
        raise UsageError(f"--adapt-buffer {a.adapt_buffer} is invalid; use positions >= 1")
    if a.adapt_cache and a.adapt == "off":
        raise UsageError("--adapt-cache keeps what --adapt learns; give --adapt key or global")
    if a.drain_timeout < 0:
        raise UsageError(f"--drain-timeout {a.drain_timeout:g} is invalid; use seconds >= 0")
    for flag, port in (("--port", a.port), ("--ollama-port", a.ollama_port)):
        if port is not None and not 0 < port < 65536:
            raise UsageError(f"{flag} {port} is invalid; use 1..65535")
    if a.ollama_port == a.port:
        raise UsageError(
            f"--ollama-port {a.ollama_port} is --port's; give another port (Ollama's routes are "
            f"on --port as well)"
        )
    # the second port is taken now, before the models load, so that one in use fails at once
    sockets = None if a.ollama_port is None else [_listen(a.host, a.ollama_port, "--ollama-port")]
    try:
        return _serve(a, sockets)
    finally:
        for sock in sockets or []:
            sock.close()


def _serve(a: argparse.Namespace, sockets: list | None) -> int:
    """`serve` once its flags are checked: the engine, the app, and uvicorn on --port (and on
    the sockets given: --ollama-port's) until SIGTERM or Ctrl-C."""
    import ipaddress
    import os

    import uvicorn

    from specwise.server.app import create_app

    api_keys = a.api_key or [k for k in [os.environ.get("SPECWISE_API_KEY")] if k]
    try:
        loopback = a.host == "localhost" or ipaddress.ip_address(a.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not api_keys:
        print(
            f"specwise: warning: serving on {a.host} without an API key; anyone who can reach "
            f"this address can use the model (set --api-key or SPECWISE_API_KEY)",
            file=sys.stderr,
        )
    from specwise.trace import JsonlSink

    sink = JsonlSink(a.trace) if a.trace else None
    engine = _build_engine(a, trace=sink, max_sequences=a.max_batch + 2)  # + engine's checks
    name = a.pair or engine.target.info.model
    if a.target and a.target.startswith("ollama:") and not a.pair:  # named as Ollama names it
        from specwise.stores import parse_name

        name = parse_name(a.target).display
    app = create_app(
        engine,
        name,
        max_batch=a.max_batch,
        max_queue=a.max_queue,
        api_keys=api_keys,
        cors_origins=a.cors or None,
        prefill_chunk=a.prefill_chunk or None,
        whole_prompt=a.whole_prompt,
        max_body_bytes=int(a.max_body_mb * (1 << 20)),
        max_prompt=a.max_prompt,
        max_new_tokens=a.max_new_tokens,
        streams_per_key=a.streams_per_key,
        adapter=engine.learner,
    )
    ollama_url = f"http://{a.host}:{a.ollama_port or a.port}"
    print(
        f"specwise: serving {name} on http://{a.host}:{a.port}/v1 "
        f"(backend {engine.target.info.backend}, k={engine.k}, "
        f"drafters: {', '.join(d.name for d in engine.drafters) or 'none'}); "
        f"Ollama's API: {ollama_url}/api; trace inspector: http://{a.host}:{a.port}/ui",
        file=sys.stderr,
    )
    # uvicorn drains on SIGTERM, then raises the signal again as it returns: leave through
    # `finally` (what was learnt is saved) with status 0 rather than die of it
    previous = signal.signal(signal.SIGTERM, _exit_quietly)
    how = {"log_level": "warning", "timeout_graceful_shutdown": a.drain_timeout}
    try:
        if sockets is None:
            uvicorn.run(app, host=a.host, port=a.port, **how)
        else:  # one app on both ports: OpenAI's and Ollama's routes on each, as Ollama does
            sockets.insert(0, _listen(a.host, a.port, "--port"))
            uvicorn.Server(uvicorn.Config(app, host=a.host, port=a.port, **how)).run(sockets)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _save_memory(a, engine)
        if sink is not None:
            sink.close()
    return 0


def _listen(host: str, port: int, flag: str):
    """A socket bound to host:port for uvicorn to listen on, or UsageError naming the flag."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = "; Ollama itself may be listening there: stop it, or give another port"
        raise UsageError(
            f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror or exc})"
            f"{hint if flag == '--ollama-port' else ''}"
        ) from None
    return sock


def cmd_inspect(a: argparse.Namespace) -> int:
    import uvicorn
    from fastapi import FastAPI

    from specwise.server import inspector, saved

    if not 0 < a.port < 65536:
        raise UsageError(f"--port {a.port} is invalid; use 1..65535")
    source = saved.load(a.path)
    app = FastAPI(title="specwise inspect", docs_url=None, redoc_url=None, openapi_url=None)
    inspector.add_routes(app, source)
    print(
        f"specwise: inspecting {a.path} at http://127.0.0.1:{a.port}/ui "
        f"(read only, this machine only; Ctrl-C stops)",
        file=sys.stderr,
    )
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")
    return 0


def _heads_score(a: argparse.Namespace) -> int:
    """`specwise heads score`: each trained network's held-out score on this machine's data
    (the heads on their self-distillation data, an eagle layer on `heads data`'s)."""
    from specwise import distill, eagle_training, teacher
    from specwise.backends import resolve_model
    from specwise.drafters import eagle
    from specwise.drafters.heads import Heads, heads_path

    _apply_pair(a)
    model = resolve_model(a.target)
    folder = heads_path(model)
    files = [Path(f) for f in a.file] or [
        p for p in (folder / distill.HEADS_FILE, eagle.find(model)) if p and p.exists()
    ]
    if not files:
        raise UsageError(
            f"no drafting heads or layer are trained for {model.name} here; train with "
            f"`specwise heads train --target {a.target}`, or name a file with --file"
        )
    nets = []
    for f in files:
        if not f.is_file():
            raise UsageError(f"--file {f}: no such file")
        try:
            nets.append(Heads.load(f))
        except ValueError:
            try:
                nets.append(eagle.Layer.load(f))
            except ValueError:
                raise UsageError(
                    f"{f} holds neither drafting heads nor a drafting layer specwise can read"
                ) from None

    def share(r: dict) -> str:  # the first (head's) share, "—" where nothing was scored
        return f"{r['alone'][0]:.3f}" if r["scored"] else "—"

    for f, net in zip(files, nets, strict=True):
        if isinstance(net, eagle.Layer):
            try:
                data = teacher.Data(eagle.data_path(model, net.layers))
            except ValueError as exc:
                raise UsageError(f"{exc} (for {f})") from None
            got = eagle_training.evaluate(net, data)
            kinds = ", ".join(f"{k} {v['alpha']}" for k, v in got["by_kind"].items())
            print(
                f"{f}: trained on {net.meta.get('positions', '?')} positions; held out, its "
                f"argmax is the target's token at depths 1..{net.depth} {got['alpha']} over "
                f"{got['scored_positions']} positions ({kinds}); greedy answers' chain τ "
                f"{got['chain_tau']}"
            )
            continue
        try:
            data = distill.load_data(folder / "work")
        except ValueError as exc:
            raise UsageError(
                f"{exc}; `specwise heads train --target {a.target}` makes it"
            ) from None
        got = distill.score(net, data)
        print(
            f"{f}: trained on {net.meta.get('positions', '?')} positions; held out, its first "
            f"head's argmax is the target's token {share(got['all'])} of the time over "
            f"{got['all']['scored']} positions (greedy answers {share(got['greedy'])}, "
            f"sampled {share(got['sampled'])})"
        )
    return 0


def _heads_data(a: argparse.Namespace) -> int:
    """`specwise heads data`: the eagle drafter's training data for the target, resumable."""
    from specwise import teacher
    from specwise.backends import model_layers, resolve_model
    from specwise.drafters.eagle import data_path, layers_for

    if a.positions < 1 or not 0.0 <= a.answers <= 1.0 or a.sequences < 1:
        raise UsageError(
            f"--positions {a.positions}, --answers {a.answers}, --sequences {a.sequences}: "
            "use --positions >= 1, --answers a share 0..1 and --sequences >= 1"
        )
    if a.minutes is not None and not a.minutes > 0:
        raise UsageError(f"--minutes {a.minutes} is invalid; use a number > 0")
    _apply_pair(a)
    model = resolve_model(a.target)
    layers = layers_for(model_layers(model))
    a.backend = "ik_llama" if a.backend == "auto" and not model.is_dir() else a.backend
    target, _ = _load_models(a, need_draft=False, max_sequences=a.sequences, hidden=layers)
    folder = data_path(model, layers)
    got = teacher.collect(target, folder, a.positions, a.answers, a.minutes, a.sequences)
    for kind, k in got["kinds"].items():
        print(f"{kind}: {k['positions']} positions in {k['seconds']:.0f} s "
              f"({k['positions_per_s']} positions/s)")
    print("by source: " + ", ".join(f"{s} {n}" for s, n in sorted(got["sources"].items())))
    print(f"specwise: {folder} holds {sum(k['positions'] for k in got['kinds'].values())} "
          f"positions ({got['held_out_positions']} held out)")
    return 0


def _heads_train_eagle(a: argparse.Namespace) -> int:
    """`specwise heads train --arch eagle`: the eagle drafter's layer, on `heads data`'s data."""
    import time as _time

    from specwise import eagle_training, teacher
    from specwise.backends import model_layers, resolve_model
    from specwise.drafters.eagle import FILE, Layer, data_path, layers_for
    from specwise.drafters.heads import heads_path, model_key

    if a.width < 8 or a.width % 8 or a.depth < 1:
        raise UsageError(
            f"--width {a.width}, --depth {a.depth}: use a width that is a multiple of 8 and a "
            "depth >= 1"
        )
    _apply_pair(a)
    model = resolve_model(a.target)
    layers = layers_for(model_layers(model))
    folder = data_path(model, layers)
    try:
        data = teacher.Data(folder)
    except ValueError:
        raise UsageError(
            f"no training data for {model.name} here yet; make it with `specwise heads data "
            f"--target {a.target}` (resumable; about 100-130 positions/s on 2 cores)"
        ) from None
    target, _ = _load_models(a, need_draft=False, hidden=layers)
    ids = eagle_training.choose_vocab(data, a.vocab or 4096, always=sorted(target.eos_token_ids))
    print(f"specwise: {len(data)} positions; a vocabulary of {len(ids)} tokens covers "
          f"{eagle_training.coverage(data, ids):.1%} of the target's top tokens", file=sys.stderr)
    meta = {"key": model_key(model)[:20], "model": model.name, "sha256": model_key(model)}
    layer = Layer(target.hidden_size // len(layers), layers, ids, target.vocab_size,
                  width=a.width, depth=a.depth, meta=meta)
    ckpt = folder / f"layer-{a.width}-{a.depth}-{len(ids)}.pt"
    result = eagle_training.train(layer, data, a.minutes * 60.0, checkpoint=ckpt)
    layer.meta.update(trained=_time.strftime("%Y-%m-%dT%H:%M:%S"), positions=len(data),
                      data=teacher.summary(folder), **result)
    out = heads_path(model) / FILE
    layer.save(out)
    print(f"held out: the layer's argmax is the target's at depths 1..{a.depth} "
          f"{result['alpha']}; greedy answers' chain τ {result['chain_tau']}")
    print(f"specwise: saved to {out}; draft with --drafter eagle (or among them, with --k auto)")
    return 0


def cmd_heads(a: argparse.Namespace) -> int:
    from specwise import distill

    if a.heads_command == "score":
        return _heads_score(a)
    if a.heads_command == "data":
        return _heads_data(a)
    if not a.minutes > 0 or a.heads < 1 or (a.vocab is not None and a.vocab < 16) or a.sequences < 1:
        raise UsageError(
            "--minutes needs a number > 0, --heads an integer >= 1, --vocab >= 16 and "
            "--sequences >= 1"
        )
    if a.arch == "eagle":
        return _heads_train_eagle(a)
    target, _ = _load_models(a, need_draft=False, max_sequences=a.sequences, hidden=True)
    out = distill.run(target, a.minutes, a.heads, a.vocab or 2048, a.sequences)
    print(f"specwise: saved to {out}; draft with --drafter heads (or among them, with --k auto)")
    return 0


def _exit_quietly(signum, frame) -> None:
    raise SystemExit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specwise", description="Exact, measured speculative decoding for local LLMs."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt and summarise the rounds")
    _model_args(g)
    g.add_argument(
        "--k",
        type=_k,
        default="auto",
        help="draft tokens per round: auto (default: the controller decides each round), "
        "or a fixed integer (0: plain decoding)",
    )
    _sampling_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument(
        "--acceptance",
        default="exact",
        help="acceptance rule: exact (default: the target's distribution), or, for sampled "
        "output only, a LOSSY one: typical (Medusa's) or top-N (a draft token among the "
        "target's N most likely); the output then is not the target's distribution (flagged)",
    )
    g.add_argument(
        "--trace",
        help="append every round, with its detail (draft, p and q, top of p), as JSON lines to "
        "this file (`specwise inspect FILE` shows it)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object instead")
    g.add_argument("prompt", help="prompt text, or - to read stdin")
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="the model catalog and the models on this machine")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser(
        "list",
        help="catalog models and pairs, whether they are pulled, and the GGUF models of Ollama, "
        "LM Studio and the Hugging Face cache on this machine, each with a draft to try",
    )
    mp = msub.add_parser("pull", help="download, assemble and verify a model (or a pair)")
    mp.add_argument("name")
    mp.add_argument("--from", dest="source", help="use this local file instead of downloading")
    mpath = msub.add_parser(
        "path", help="print the file of a pulled model (or of ollama:NAME[:TAG] in Ollama's store)"
    )
    mpath.add_argument("name")
    m.set_defaults(func=cmd_models)

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
        help="one prompt per category, 64 tokens, k in {4, auto} (a few minutes)",
    )
    bsub = b.add_subparsers(dest="bench_command")
    bb = bsub.add_parser(
        "backend", help="plain decoding vs llama-cpp-python, overhead, cost curves"
    )
    _model_args(bb)
    bb.add_argument("--max-tokens", type=int, default=128)
    bb.add_argument("--repeats", type=int, default=3)
    bb.add_argument("--out", help="output folder (default bench-results/<timestamp>-backend)")
    bt = bsub.add_parser(
        "batch", help="what batched target calls cost by shape, measured and as the model prices"
    )
    _model_args(bt)
    bt.add_argument("--sequences", type=int, default=8, help="the largest batch (default 8)")
    bt.add_argument("--repeats", type=int, default=5)
    bt.add_argument("--out", help="output folder (default bench-results/<timestamp>-batch)")
    br = bsub.add_parser(
        "report",
        help="rebuild report.md, summary.json and plots from a run's JSONL files (of a "
        "`bench adapt` run: report.md and by_request.png)",
    )
    br.add_argument("folder", help="the run's --out folder")
    br.add_argument("--json", action="store_true", help="end stdout with the summary as JSON")
    bp = bsub.add_parser(
        "steps",
        help="a trace's step accounting: what auto's speculative steps saved, by batch size",
    )
    bp.add_argument("trace", help="a rounds.jsonl (from serve --trace, or a bench run)")
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
        "set by '+' (drafters that copy text: ngram, suffix, suffix-chain; default "
        "'ngram;ngram+suffix')",
    )
    bv.add_argument("--categories", type=_csv(str, "names"), help="categories to run")
    bv.add_argument("--prompts", help="a JSONL file of prompts instead of the shipped ones")
    bv.add_argument("--limit", type=int, help="prompts per category")
    bv.add_argument("--max-tokens", type=int, default=256, help="tokens per answer (256)")
    bv.add_argument("--out", help="output folder (default bench-results/<timestamp>-replay)")
    ba = bsub.add_parser(
        "adapt",
        help="a drafter on hidden states on requests it was not trained for, as trained and "
        "adapting (serve --adapt), against plain decoding, request after request",
    )
    _heads_target_args(ba)
    ba.add_argument(
        "--drafter",
        choices=["heads", "eagle"],
        default="heads",
        help="the drafter that adapts: the heads, or the eagle layer (heads)",
    )
    ba.add_argument("--requests", type=int, default=200, help="requests, each run three ways (200)")
    ba.add_argument("--k", type=int, default=1, help="tokens drafted a round (1; eagle drafts 1)")
    ba.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (64)")
    ba.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0)")
    ba.add_argument(
        "--budget",
        type=float,
        default=0.1,
        help="share of one core the adaptation may use while a request decodes (0.1; 0: none)",
    )
    ba.add_argument(
        "--idle-budget",
        type=float,
        default=1.0,
        help="share of one core the adaptation may use between requests (1.0)",
    )
    ba.add_argument(
        "--think",
        type=float,
        default=5.0,
        help="seconds between two requests, a user reading the answer, in which the adaptation "
        "runs alone, untimed, until it has nothing left to learn (5; 0: back to back)",
    )
    ba.add_argument("--out", help="output folder (default bench-results/<timestamp>-adapt)")
    be = bsub.add_parser(
        "engines",
        help="specwise and llama-server side by side on the same files and prompts, "
        "speculation on and off",
    )
    be.add_argument("--pair", default="qwen-coder", help="the model pair (qwen-coder)")
    be.add_argument("--target", help="a catalog model instead of the pair's target")
    be.add_argument("--draft", help="a catalog model instead of the pair's draft")
    be.add_argument(
        "--engines",
        type=_csv(str, "names"),
        default=["specwise", "llama-server"],
        help="engines to start: specwise, llama-server (default both; llama-server needs "
        "`make external`)",
    )
    be.add_argument(
        "--url",
        help="servers already running, used as they are, as NAME=URL,NAME=URL (beside the "
        "engines started)",
    )
    be.add_argument(
        "--llama-server-modes",
        type=_csv(str, "names"),
        help="llama-server's speculative modes (default: none,ngram-simple,ngram-map-k,"
        "ngram-mod,draft)",
    )
    be.add_argument(
        "--k",
        type=_csv(_k, "k values"),
        help="specwise's speculative.k per request, 0 among them (default auto,0)",
    )
    be.add_argument(
        "--backend", choices=["auto", *BACKENDS], help="specwise serve's --backend (auto)"
    )
    be.add_argument(
        "--concurrency",
        type=_csv(int, "integers"),
        default=[1, 2, 4],
        help="requests in flight, one level each (default 1,2,4)",
    )
    be.add_argument("--requests", type=int, default=8, help="requests per level and round (8)")
    be.add_argument(
        "--rounds", type=int, default=2, help="each level's settings this many times (2)"
    )
    be.add_argument("--prompts", help="a JSONL file of prompts (default: the shipped ones)")
    be.add_argument("--categories", type=_csv(str, "names"), help="shipped categories to use")
    be.add_argument("--limit", type=int, help="prompts per category")
    be.add_argument("--max-tokens", type=int, default=96, help="new tokens per request (96)")
    be.add_argument("--api-key", help="for the servers given by --url")
    be.add_argument("--out", help="output folder (default bench-results/<timestamp>-engines)")
    bl = bsub.add_parser("load", help="load-test any OpenAI-compatible server")
    bl.add_argument(
        "--url",
        required=True,
        help="server base URL, e.g. http://127.0.0.1:8000; several side by side as "
        "NAME=URL,NAME=URL (the last server's last k is the baseline)",
    )
    bl.add_argument("--model", help="model name to send (default: none, the server's)")
    bl.add_argument(
        "--concurrency",
        type=_csv(int, "integers"),
        help="closed loop: requests in flight, one level each (default 1,2,4,8)",
    )
    bl.add_argument(
        "--rate",
        type=_csv(float, "numbers"),
        help="open loop instead of --concurrency: Poisson arrivals at each of these rates "
        "(requests/s), e.g. 0.1,0.2,0.4; needs --stream",
    )
    bl.add_argument("--seed", type=int, default=0, help="of the open loop's arrival times (0)")
    bl.add_argument(
        "--slo-ttft", type=float, default=2.0, help="SLO: seconds to the first token (2)"
    )
    bl.add_argument(
        "--slo-tpot",
        type=float,
        default=0.2,
        help="SLO: seconds per output token after the first, on average (0.2)",
    )
    bl.add_argument(
        "--slo-target",
        type=float,
        default=0.9,
        help="share of a level's requests that must meet the SLO for it to hold (0.9)",
    )
    bl.add_argument("--requests", type=int, default=16, help="requests per level and round")
    bl.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run each level's settings this many times, order reversed every other round",
    )
    bl.add_argument("--prompts", help="a JSONL file of prompts (default: the shipped ones)")
    bl.add_argument("--categories", type=_csv(str, "names"), help="shipped categories to use")
    bl.add_argument("--stream", action="store_true", help="stream (needed for TTFT)")
    bl.add_argument("--max-tokens", type=int, default=128)
    bl.add_argument(
        "--k",
        type=_csv(_k, "k values"),
        help="specwise only: speculative.k per request, e.g. auto,0 (side by side)",
    )
    bl.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    bl.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="instead of levels: keep one level busy this long, sampling the server's /health",
    )
    bl.add_argument(
        "--sample-every", type=float, default=60.0, help="seconds between /health samples (60)"
    )
    bl.add_argument(
        "--faults",
        type=float,
        metavar="SECONDS",
        help="with --soak: also inject one fault (bench.faults, at random) every SECONDS",
    )
    bl.add_argument(
        "--alone",
        action="store_true",
        help="with --soak: afterwards run the first 12 prompts alone and check the soak's greedy "
        "answers to them (equal, or parted at a near-tie, judged by their log-probabilities)",
    )
    bl.add_argument("--out", help="output folder (default bench-results/<timestamp>-load)")
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser(
        "recommend",
        help="from a `bench engines` run: the speculative settings that were best, for "
        "another engine",
    )
    r.add_argument("run", help="the run's folder (its --out)")
    r.add_argument(
        "--for",
        dest="engine",
        required=True,
        choices=["llama-server", "vllm", "sglang"],
        help="the engine to write settings for",
    )
    r.add_argument(
        "--concurrency", type=int, help="requests in flight to recommend for (the run's first)"
    )
    r.add_argument("--json", action="store_true", help="the recommendation as JSON")
    r.set_defaults(func=cmd_recommend)

    s = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server with continuous batching, Ollama's API beside",
    )
    _model_args(s)
    s.add_argument("--k", type=_k, default="auto", help="default k for requests (auto)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--ollama-port",
        type=int,
        help="also serve on this port (Ollama's is 11434), so that Ollama's clients connect "
        "unchanged; Ollama's API (/api/chat, /api/generate, /api/tags, ...) is on --port too",
    )
    s.add_argument("--max-batch", type=int, default=4, help="sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    s.add_argument(
        "--prefill-chunk",
        type=int,
        default=PREFILL_CHUNK,
        help=f"tokens of a long prompt fed between two rounds, so it does not stall the "
        f"running streams (default {PREFILL_CHUNK}; 0: whole prompts; exact mode: whole)",
    )
    s.add_argument(
        "--max-prompt", type=int, default=0, help="prompt tokens a request may send (0: context)"
    )
    s.add_argument(
        "--max-new-tokens",
        type=int,
        default=0,
        help="max_tokens a request may ask for (0: up to the context); a request asking more "
        "gets a 400, one naming none gets at most this",
    )
    s.add_argument(
        "--streams-per-key",
        type=int,
        default=0,
        help="requests of one API key queued or running at once (0: no limit); 429 past it",
    )
    s.add_argument("--max-body-mb", type=float, default=4.0, help="largest request body in MiB (4)")
    s.add_argument(
        "--whole-prompt",
        type=int,
        default=WHOLE_PROMPT,
        help=f"prompts of at most this many tokens go in whole, before and after each round, "
        f"so a short request's first token takes one forward (default {WHOLE_PROMPT})",
    )
    s.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM or Ctrl-C: stop taking requests, let those in flight finish for up to "
        "this many seconds, then cancel the rest (30)",
    )
    s.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require 'Authorization: Bearer KEY' with this key (or SPECWISE_API_KEY); "
        "repeatable: each key is a tenant whose text the suffix drafter keeps apart",
    )
    s.add_argument("--cors", action="append", default=[], help="allowed CORS origin (repeatable)")
    s.add_argument("--trace", help="append every round of every request as JSON lines here")
    s.add_argument(
        "--adapt",
        choices=["off", "key", "global"],
        default="off",
        help="keep training the drafter on hidden states named in --drafter (heads or eagle) "
        "on the traffic served (online speculative decoding), in a background thread: key: "
        "one adapted copy per API key, global: one for all requests (default off)",
    )
    s.add_argument(
        "--adapt-budget",
        type=float,
        default=0.1,
        help="share of one core the adaptation may use while requests are in (0.1; 0: none, "
        "it learns only while the server is idle)",
    )
    s.add_argument(
        "--adapt-idle-budget",
        type=float,
        default=1.0,
        help="share of one core the adaptation may use while no request is in (1.0)",
    )
    s.add_argument(
        "--adapt-buffer",
        type=int,
        default=8192,
        help="served positions each adapted copy keeps to learn from, the newest (8192)",
    )
    s.add_argument(
        "--adapt-cache",
        help="keep the adapted drafter in this file across runs (read at start, written at exit)",
    )
    s.set_defaults(func=cmd_serve)

    h = sub.add_parser("heads", help="drafting heads on the target's hidden states")
    hsub = h.add_subparsers(dest="heads_command", required=True)
    ht = hsub.add_parser(
        "train",
        help="train heads for the target on this machine (self-distillation; resumable)",
    )
    _heads_target_args(ht)
    ht.add_argument("--minutes", type=float, default=30.0, help="time for data and training (30)")
    ht.add_argument(
        "--arch",
        choices=("heads", "eagle"),
        default="heads",
        help="what to train: Medusa-style heads on the last state (--drafter heads; makes its "
        "own data), or the EAGLE-3-style layer over three layers' states (--drafter eagle; on "
        "the data of `specwise heads data`)",
    )
    ht.add_argument("--heads", type=int, default=3, help="heads, one per token drafted (3)")
    ht.add_argument(
        "--vocab", type=int,
        help="tokens the network can name, most frequent (heads 2048, eagle 4096)",
    )
    ht.add_argument("--width", type=int, default=768, help="the eagle layer's width (768)")
    ht.add_argument(
        "--depth", type=int, default=4, help="draft depth the eagle layer is trained to (4)"
    )
    ht.add_argument("--sequences", type=int, default=8, help="answers generated at once (8)")
    hd = hsub.add_parser(
        "data",
        help="training data for the eagle drafter at prefill speed: the target reads the local "
        "corpus (teacher forcing) and answers prompts; resumable, kept in $SPECWISE_HOME",
    )
    _heads_target_args(hd)
    hd.add_argument(
        "--positions", type=int, default=1_000_000, help="positions to hold in all (1000000)"
    )
    hd.add_argument(
        "--answers", type=float, default=0.3,
        help="share of the positions the target answers by decoding, the rest read (0.3)",
    )
    hd.add_argument("--minutes", type=float, help="stop after this long (default: no limit)")
    hd.add_argument("--sequences", type=int, default=8, help="answers decoded at once (8)")
    hs = hsub.add_parser(
        "score",
        help="how often trained networks' argmax is the target's token on the held-out tenth "
        "of this machine's training data, greedy and sampled answers apart",
    )
    _heads_target_args(hs)
    hs.add_argument(
        "--file",
        action="append",
        default=[],
        help="a heads or layer file to score (repeatable; default: the trained heads.pt and "
        "eagle.pt)",
    )
    h.set_defaults(func=cmd_heads)

    i = sub.add_parser(
        "inspect", help="the trace inspector (in the browser) over a saved trace or bench run"
    )
    i.add_argument("path", help="a trace (.jsonl from --trace) or a bench run folder")
    i.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (8765)")
    i.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        return a.func(a)
    except (UsageError, ValueError, OSError) as exc:
        print(f"specwise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specwise: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
