"""The bench's subcommands that measure servers over HTTP: `bench engines` (specwise and
llama-server side by side on the same files and prompts) and `bench load` (any OpenAI-compatible
server: levels, an open loop, or a soak), their flags and checks, and the servers `--url` names
(`_servers`).

It sends no request itself: `bench.engines`, `bench.load` and `bench.soak` do.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specwise.backends import BACKENDS
from specwise.cli.common import UsageError
from specwise.cli.options import _csv, _k

__all__ = ["add_parser"]


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


def _bench_engines(a: argparse.Namespace) -> int:
    from specwise.backends.requant import split_name
    from specwise.bench.engines import ENGINES, EnginesOptions, run_engines
    from specwise.bench.session import default_out
    from specwise.bench.workloads import builtin, interleaved, load_jsonl
    from specwise.engines.llama_server import MODES
    from specwise.models import CATALOG, PAIRS

    if a.pair not in PAIRS:
        raise UsageError(f"--pair {a.pair!r} is unknown; known pairs: {', '.join(PAIRS)}")
    target, draft = a.target or PAIRS[a.pair].target, a.draft or PAIRS[a.pair].draft
    for flag, name in (("--target", target), ("--draft", draft)):
        if split_name(name)[0] not in CATALOG:
            raise UsageError(
                f"{flag} {name!r} is not a catalog model; use one of {', '.join(CATALOG)} "
                f"(or one of them @RECIPE, requantized: @q4_0, @q5_0, @iq4_nl)"
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


def _bench_load(a: argparse.Namespace) -> int:
    import os

    from specwise.bench.load import LoadOptions, Slo, run_load
    from specwise.bench.session import default_out
    from specwise.bench.soak import run_soak
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


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """`bench engines` and `bench load` and their flags."""
    be = bsub.add_parser(
        "engines",
        help="specwise and llama-server side by side on the same files and prompts, "
        "speculation on and off",
    )
    be.add_argument("--pair", default="qwen-coder", help="the model pair (qwen-coder)")
    be.add_argument("--target", help="a catalog model instead of the pair's target")
    be.add_argument(
        "--draft",
        help="a catalog model instead of the pair's draft (NAME@q4_0: requantized, for both)",
    )
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
    be.set_defaults(func=_bench_engines)
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
    bl.set_defaults(func=_bench_load)
