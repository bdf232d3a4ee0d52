"""The flags several commands share, and how their values are read.

The model flags of `generate`, `serve` and the bench (`_model_args`; a command about the
target's drafting networks takes `_heads_target_args`), `--k` (`_k`), comma-separated lists
(`_csv`), the adaptation's shares of a core (`_check_budgets`), drafter sets (`_drafter_sets`)
and the prompts a bench command runs (`_bench_prompts`).

It declares and reads flags only: it loads no model and runs no command, and a flag of one
command alone is in that command's module.
"""

from __future__ import annotations

import argparse

from specwise.backends import BACKENDS
from specwise.cli.common import UsageError
from specwise.drafters.suffix import SCOPES

__all__ = ["TARGET_HELP"]


TARGET_HELP = (
    "target model: catalog name, .gguf file, HF folder, or ollama:NAME[:TAG] (a model of "
    "Ollama's store, run in place; `models list` shows those found)"
)


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
        help="drafters, comma separated (model, cascade, ngram, suffix, suffix-chain, heads, "
        "eagle); default with --k auto: ngram and suffix, plus model with --draft and (serve, "
        "bench) eagle where a layer is trained or shipped for the target; with a fixed k: "
        "model with --draft, else ngram",
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


def _heads_target_args(p: argparse.ArgumentParser) -> None:
    """The target of a command about its drafting heads (no draft model, never exact)."""
    p.add_argument("--pair", help="catalog pair whose target the heads are for")
    p.add_argument("--target", help=TARGET_HELP)
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto")
    p.add_argument("--threads", type=int, help="threads (default: the cores)")
    p.set_defaults(draft=None, exact=False)


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


def _csv(convert, what: str):
    def parse(value: str) -> list:
        try:
            return [convert(x.strip()) for x in value.split(",") if x.strip()]
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a comma-separated list of {what}"
            ) from None

    return parse


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


def _drafter_sets(value: str) -> list[list[str]]:
    """'a;b+c' -> [[a], [b, c]]: sets separated by ';', names in a set by '+'."""
    sets = [[n.strip() for n in s.split("+") if n.strip()] for s in value.split(";")]
    return [s for s in sets if s]


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
