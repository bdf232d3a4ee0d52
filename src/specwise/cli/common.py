"""What several commands build from their flags, and the error a command ends with.

`UsageError` (bad input: one sentence, exit status 2); `--pair` filling `--target` and
`--draft` (`_apply_pair`); the models (`_load_models`); the drafters asked for and their options,
checked before any model loads (`_drafter_names`, `_drafter_options`, the networks trained for
the target: `_trained`, and what the target keeps of its states for them: `_hidden`); the
engine with its controller and serve --adapt's learner (`_build_engine`); what a run learnt,
saved at its end (`_save_memory`).

It declares no flag, prints no command's output and imports no module of the CLI: each
command's module holds its own, `options` the flags several share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from specwise.drafters import DRAFT_MODEL

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad input from the command line; printed as one sentence."""


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


def _default_drafters(draft: bool, auto: bool, layer: bool = False) -> list[str]:
    """The drafters used where --drafter is not given: with k=auto the n-gram and suffix
    drafters, the draft model when there is one and, for `layer` (serve and the bench, where
    one is found for the target: `_layer_found`), the eagle layer; with a fixed k the draft
    model if there is one, else the n-gram drafter. generate leaves the layer out: loading
    torch and the layer takes seconds at every start, more than it saves on one answer."""
    if auto:
        return ["ngram", "suffix", *(["model"] if draft else []), *(["eagle"] if layer else [])]
    return ["model"] if draft else ["ngram"]


def _layer_found(a: argparse.Namespace) -> bool:
    """Whether an eagle layer is trained here or shipped for --target (`eagle.find`; a catalog
    name is looked up without pulling it), unless --backend llama_cpp, which cannot keep the
    layers' states (a backend chosen that cannot: `_load_drafting` drops the layer)."""
    from specwise.backends import resolve_model
    from specwise.drafters import eagle
    from specwise.models import CATALOG

    if a.backend == "llama_cpp" or not a.target:
        return False
    target = str(a.target)
    if target not in CATALOG:
        if not (Path(target).exists() or target.startswith("ollama:")):
            return False
        try:
            target = resolve_model(target)
        except (OSError, ValueError):  # the load says why
            return False
    return eagle.find(target) is not None


def _drafter_names(a: argparse.Namespace, layer: bool = False) -> list[str]:
    """The drafters asked for: --drafter a,b, else `_default_drafters` (the eagle layer among
    them for `layer`; the draft model's text drafter, model-text, is added by `_build_engine`
    once both models are loaded, where its tokenizer is not the target's)."""
    if a.drafter:
        names = [n.strip() for n in a.drafter.split(",") if n.strip()]
    else:
        auto = a.k == "auto"
        names = _default_drafters(bool(a.draft), auto, layer and auto and _layer_found(a))
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


def _load_drafting(
    a: argparse.Namespace,
    names: list[str],
    options: dict[str, dict],
    need_draft: bool,
    max_sequences: int = 1,
):
    """`_load_models` for drafters `names` (the target keeping the states they read,
    `_hidden`). Where the eagle layer was among the default drafters (no --drafter) and the
    backend chosen cannot keep its states, it is dropped from `names` and `options` with a
    note, and the models load without it."""
    from specwise.backends.base import NoLayerStates

    try:
        return _load_models(a, need_draft, max_sequences, hidden=_hidden(names, options))
    except NoLayerStates as exc:
        named = a.drafter or "eagle" in (getattr(a, "auto_drafters", None) or "")
        if named or "eagle" not in names:  # asked for by name: the error stands
            raise
        print(f"specwise: drafting without the eagle layer: {exc}", file=sys.stderr)
    names.remove("eagle")
    del options["eagle"]
    return _load_models(a, need_draft, max_sequences, hidden=_hidden(names, options))


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
        try:
            return eagle.Layer.load(path)
        except ValueError as exc:
            raise UsageError(
                f"{exc}; train it again on the data kept: `specwise heads train --target "
                f"{a.target} --arch eagle`, or drop eagle from --drafter"
            ) from None
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


def _build_engine(
    a: argparse.Namespace, trace=None, max_sequences: int = 1, layer: bool = False
):
    """The engine of generate and serve, with its drafters (`_drafter_names`; `layer`: the
    eagle layer among the defaults, for serve), its controller and serve --adapt's learner."""
    from specwise.backends.base import check_same_vocab
    from specwise.drafters import make_drafters
    from specwise.engine import Engine

    _apply_pair(a)
    names = _drafter_names(a, layer)
    adapts = _adapted_drafter(a, names)
    options = _drafter_options(a, names)
    need_draft = any(n in DRAFT_MODEL for n in names)
    target, draft = _load_drafting(a, names, options, need_draft, max_sequences)
    if adapts and adapts not in names:  # the layer, dropped where the backend cannot run it
        adapts = _adapted_drafter(a, names)
    adapter = _adapter(a, adapts, options)
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
