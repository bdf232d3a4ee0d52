"""`specwise heads`, every subcommand of it: the drafting networks on the target's hidden
states trained (`train`: the heads by `distill`, the eagle layer by `eagle_training`), the eagle
layer's data made (`data`, by `teacher`), their held-out scores (`score`) and the eagle layer
shipped with the package (`ship`), with their flags and what they print.

No training, data or scoring logic: those modules hold it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specwise.cli.common import UsageError, _apply_pair, _load_models
from specwise.cli.options import _heads_target_args

__all__ = ["add_parser", "cmd_heads"]


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
            print(f"{f}: trained on {net.meta.get('positions', '?')} positions")
            print(_layer_table(eagle_training.evaluate(net, data), "held out"))
            bench = eagle.bench_path(model, net.layers)
            if teacher.bench_complete(bench):
                print(_layer_table(eagle_training.evaluate(net, teacher.Data(bench)), "bench"))
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
    from specwise.drafters.eagle import bench_path, data_path, layers_for

    if a.positions < 1 or not 0.0 <= a.answers <= 1.0 or a.sequences < 1 or a.invent < 0:
        raise UsageError(
            f"--positions {a.positions}, --answers {a.answers}, --sequences {a.sequences}, "
            f"--invent {a.invent}: use --positions >= 1, --answers a share 0..1, --sequences "
            ">= 1 and --invent >= 0"
        )
    if a.minutes is not None and not a.minutes > 0:
        raise UsageError(f"--minutes {a.minutes} is invalid; use a number > 0")
    _apply_pair(a)
    model = resolve_model(a.target)
    layers = layers_for(model_layers(model))
    a.backend = "ik_llama" if a.backend == "auto" and not model.is_dir() else a.backend
    target, _ = _load_models(a, need_draft=False, max_sequences=a.sequences, hidden=layers)
    folder = data_path(model, layers)
    bench = bench_path(model, layers)
    if not teacher.bench_complete(bench):  # what the layer is scored on, apart, made first
        teacher.bench_answers(target, bench, sequences=a.sequences)
    got = teacher.collect(
        target, folder, a.positions, a.answers, a.minutes, a.sequences, invent=a.invent
    )
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

    from specwise import eagle_training, teacher, weights
    from specwise.backends import model_layers, resolve_model
    from specwise.drafters.eagle import FILE, Layer, bench_path, data_path, layers_for
    from specwise.drafters.eagle_layer import FORMAT as LAYER_FORMAT
    from specwise.drafters.heads import heads_path, model_key
    from specwise.machine import machine

    if a.start is not None and (a.vocab, a.width, a.depth) != (None, None, None):
        raise UsageError(
            f"--from {a.start} trains that layer further, with its vocabulary, width and depth: "
            "drop --vocab, --width and --depth (or drop --from to train a new layer)"
        )
    width, depth = a.width or WIDTH, a.depth or DEPTH
    if width < 8 or width % 8 or depth < 1:
        raise UsageError(
            f"--width {width}, --depth {depth}: use a width that is a multiple of 8 and a "
            "depth >= 1"
        )
    if (a.epochs is not None and not a.epochs > 0) or (a.positions is not None and a.positions < 1):
        raise UsageError(
            f"--epochs {a.epochs}, --positions {a.positions}: use --epochs > 0 and --positions >= 1"
        )
    lr = eagle_training.LR if a.lr is None else a.lr
    if not 0 < lr < 1:
        raise UsageError(
            f"--lr {a.lr}: use a learning rate between 0 and 1, e.g. {eagle_training.LR}"
        )
    kinds = tuple(k.strip() for k in a.kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(teacher.KINDS):
        raise UsageError(
            f"--kinds {a.kinds!r}: use {' or '.join(teacher.KINDS)}, or both comma separated"
        )
    _apply_pair(a)
    model = resolve_model(a.target)
    layers = layers_for(model_layers(model))
    folder = data_path(model, layers)
    try:
        data = teacher.Data(folder, kinds=kinds)
    except ValueError:
        raise UsageError(
            f"no training data for {model.name} here yet; make it with `specwise heads data "
            f"--target {a.target}` (resumable; about 100-130 positions/s on 2 cores)"
        ) from None
    a.backend = "ik_llama" if a.backend == "auto" and not model.is_dir() else a.backend
    target, _ = _load_models(a, need_draft=False, hidden=layers)  # its sizes and end ids
    if a.start is not None:
        layer, origin = _start_layer(a.start, model, layers, target)
        ids = layer.ids
        print(f"specwise: training {origin} further ({len(layer.meta['history'])} trainings "
              f"before, {_seen(layer.meta['history'])} positions seen)", file=sys.stderr)
    else:
        ends = sorted(target.eos_token_ids)
        ids = eagle_training.choose_vocab(data, a.vocab or 4096, always=ends)
        meta = {"key": model_key(model)[:20], "model": model.name, "sha256": model_key(model)}
        layer = Layer(target.hidden_size // len(layers), layers, ids, target.vocab_size,
                      width=width, depth=depth, meta=meta,
                      unembedding=weights.unembedding(target, ids),
                      final_norm=weights.final_norm(target),
                      embedding=weights.embedding(target, ids))
    print(f"specwise: {len(data)} positions; a vocabulary of {len(ids)} tokens covers "
          f"{eagle_training.coverage(data, ids):.1%} of the target's top tokens", file=sys.stderr)
    size = ("" if a.positions is None else f"-{a.positions}") + (
        "" if kinds == teacher.KINDS else "-" + "-".join(kinds)
    ) + ("" if a.start is None else "-from-" + layer.start.split()[-1][:8])
    ckpt = folder / f"layer-{layer.width}-{layer.depth}-{len(ids)}{size}.pt"
    bench = bench_path(model, layers)
    bench_data = teacher.Data(bench) if teacher.bench_complete(bench) else None

    def judge(net: Layer) -> dict:  # a point of the learning curve
        got = {"held_out": eagle_training.evaluate(net, data, limit=CURVE_LIMIT)}
        if bench_data is not None:
            got["bench"] = eagle_training.evaluate(net, bench_data)
        return got

    fit = eagle_training.training_sequences(data, a.positions)
    total = int(data.lengths[fit].sum())
    curve = [n for n in (CURVE_FIRST * 2**i for i in range(20)) if n < total] + [total]
    result = eagle_training.train(
        layer, data, None if a.epochs else a.minutes * 60.0, checkpoint=ckpt,
        epochs=a.epochs, positions=a.positions, curve=curve if a.curve else (), judge=judge,
        lr=lr,
    )
    if bench_data is not None:
        result["bench"] = eagle_training.evaluate(layer, bench_data)
    layer.meta.update(trained=_time.strftime("%Y-%m-%dT%H:%M:%S"), positions=total,
                      data=teacher.summary(folder), kinds=list(kinds), machine=machine(),
                      lr=lr, format=LAYER_FORMAT, **result)
    layer.meta["positions_seen_in_all"] = _seen(eagle_training.lineage(layer.meta))
    out = heads_path(model) / FILE
    installed = _record(out)
    if installed is not None and installed.get("format") != LAYER_FORMAT:
        installed = None  # a layer this specwise cannot read gives way whatever it scored
    kept = installed is not None and not a.replace and eagle_training.outscores(installed, result)
    if kept:
        out = out.with_name(NEW_FILE)
    layer.save(out)
    eagle_training.save_result(out, layer.meta)
    print(_layer_table(result, "held out"))
    if bench_data is not None:
        print(_layer_table(result["bench"], "bench"))
    if result.get("curve"):
        print(_curve_table(result["curve"]))
    if kept:
        old, new = installed["bench"]["alpha"][0], result["bench"]["alpha"][0]
        print(f"specwise: kept the layer installed: on the bench's answers it scores α1 "
              f"{old:.3f}, the new one {new:.3f}; the new one is saved to {out} (--replace "
              "installs a new layer whatever it scores)")
        return 0
    print(f"specwise: saved to {out} (its training beside it, {out.with_suffix('.json').name}); "
          "draft with --drafter eagle (or among them, with --k auto)")
    return 0


NEW_FILE = "eagle.new.pt"  # where a layer goes that scores below the one installed
WIDTH, DEPTH = 768, 4  # a new eagle layer's, unless --width and --depth say


def _start_layer(name: str, model: Path, layers: list[int], target) -> tuple:
    """(layer, what it is) for `--from NAME`: `shipped` (the layer specwise ships for the
    target), `installed` (the one trained here) or a layer file; trained further, it keeps its
    vocabulary, shape and weights, its training so far (the record its file's meta holds) as
    its meta's `history` (`eagle_training.lineage`) and, as its start, the file's digest (a
    checkpoint of another start is not resumed). One UsageError where the layer is missing,
    unreadable or made for another target."""
    import hashlib

    from specwise import eagle_training
    from specwise.drafters import eagle
    from specwise.drafters.heads import heads_path, model_key

    paths = {"shipped": eagle.shipped_path(model), "installed": heads_path(model) / eagle.FILE}
    path = paths.get(name, Path(name))
    if not path.is_file():
        where = {"shipped": f"no layer ships for {model.name}",
                 "installed": f"no layer is trained for {model.name} here"}
        where_not = where.get(name, "no such file")
        raise UsageError(f"--from {name}: {where_not}; use shipped, installed or a layer file")
    try:
        layer = eagle.Layer.load(path)
    except ValueError as exc:
        raise UsageError(f"--from {name}: {exc}") from None
    made_for = layer.meta.get("sha256")
    hidden = target.hidden_size // len(layers)
    if (made_for not in (None, model_key(model)) or list(layer.layers) != list(layers)
            or (layer.hidden_size, layer.vocab_size) != (hidden, target.vocab_size)):
        raise UsageError(
            f"--from {name}: {path} is a layer for {layer.meta.get('model', 'another model')} "
            f"(layers {list(layer.layers)}, width {layer.hidden_size}), not for {model.name}"
        )
    history = eagle_training.lineage(layer.meta)  # its meta is its training record
    layer.meta = {k: layer.meta[k] for k in ("key", "model", "sha256") if k in layer.meta}
    layer.meta["history"] = history
    layer.start = "layer " + hashlib.sha256(path.read_bytes()).hexdigest()
    return layer, path


def _seen(history: list[dict]) -> int:
    """The positions a layer has seen in training, over its `lineage`."""
    return sum(int(h.get("positions_seen") or 0) for h in history)


def _record(layer_file: Path) -> dict | None:
    """The training record beside an installed layer (`<layer>.json`), or None."""
    if not layer_file.is_file():
        return None
    try:
        return json.loads(layer_file.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


ALL_KINDS = "read,answer"  # teacher.KINDS, as --kinds spells them
CURVE_FIRST = 62_500  # the learning curve's first point, in positions seen; then doublings
CURVE_LIMIT = 40_000  # held-out positions scored at each point of the curve


def _layer_table(got: dict, what: str) -> str:
    """A layer's scores (`eagle_training.evaluate`) as a table: a row per kind or category."""
    if not got["by_kind"]:
        return f"{what}: no positions to score yet (the data holds too few sequences)"
    depth = len(got["alpha"])
    head = " | ".join(f"α{j + 1}" for j in range(depth))
    lines = [f"{what}: how often the layer's argmax is the target's token, by draft depth",
             f"| {what} | positions | top token in vocabulary | {head} "
             f"| accepted a round (chain of {depth}) |",
             "|---|---|---|" + "---|" * depth + "---|"]
    for kind, v in got["by_kind"].items():
        alpha = " | ".join("—" if x is None else f"{x:.3f}" for x in v["alpha"])
        acc, inside = v.get("chain_accepted"), v.get("in_vocabulary")
        inside = "—" if inside is None else f"{inside:.3f}"
        lines.append(f"| {kind} | {v['positions']} | {inside} | {alpha} "
                     f"| {'—' if acc is None else acc} |")
    if got.get("by_read"):
        lines.append("α1 by the token a position reads: " + ", ".join(
            f"{name} {v['alpha1']:.3f} ({v['share']:.1%} of positions)"
            for name, v in got["by_read"].items()))
    return "\n".join(lines)


def _curve_table(curve: list[dict]) -> str:
    """The learning curve: by positions seen, α1 and accepted tokens a round held out and on
    the bench answers (all categories, and code generation)."""
    lines = ["learning curve (one pass: each position seen once until the last point)",
             "| positions seen | held out α1 | held out accepted | bench α1 | bench accepted "
             "| code_generation α1 | code_generation accepted |",
             "|---|---|---|---|---|---|---|"]
    for c in curve:
        held, bench = c["held_out"], c.get("bench", {"by_kind": {}})
        code = bench["by_kind"].get("code_generation", {})
        every = bench["by_kind"].get("all", {})
        cells = [(held["alpha"] or [None])[0], held.get("chain_accepted"),
                 (every.get("alpha") or [None])[0],
                 every.get("chain_accepted"), (code.get("alpha") or [None])[0],
                 code.get("chain_accepted")]
        lines.append(f"| {c['positions_seen']} | " + " | ".join(
            "—" if x is None else str(x) for x in cells) + " |")
    return "\n".join(lines)


def _heads_ship(a: argparse.Namespace) -> int:
    """`specwise heads ship`: the eagle layer trained here becomes the one specwise ships for
    the target (`eagle.ship`)."""
    from specwise.backends import resolve_model
    from specwise.drafters import eagle
    from specwise.drafters.heads import heads_path

    _apply_pair(a)
    model = resolve_model(a.target)
    trained = heads_path(model) / eagle.FILE
    if not trained.is_file():
        raise UsageError(
            f"no drafting layer is trained for {model.name} here; make one with `specwise heads "
            f"data` then `specwise heads train --arch eagle` (see `make eagle-layer`)"
        )
    out = eagle.ship(trained, model)
    size = sum(p.stat().st_size for p in out.parent.iterdir()) / 2**20
    print(f"specwise: shipped {trained} as {out} with its manifest ({size:.1f} MiB in all)")
    return 0


def cmd_heads(a: argparse.Namespace) -> int:
    from specwise import distill

    if a.heads_command == "score":
        return _heads_score(a)
    if a.heads_command == "data":
        return _heads_data(a)
    if a.heads_command == "ship":
        return _heads_ship(a)
    small_vocab = a.vocab is not None and a.vocab < 16
    if not a.minutes > 0 or a.heads < 1 or small_vocab or a.sequences < 1:
        raise UsageError(
            "--minutes needs a number > 0, --heads an integer >= 1, --vocab >= 16 and "
            "--sequences >= 1"
        )
    if a.arch == "eagle":
        return _heads_train_eagle(a)
    if (a.epochs is not None or a.positions is not None or a.curve or a.kinds != ALL_KINDS
            or a.lr is not None or a.replace or a.start is not None):
        raise UsageError(
            "--epochs, --positions, --kinds, --lr, --replace, --curve and --from train the eagle "
            "layer: add --arch eagle"
        )
    target, _ = _load_models(a, need_draft=False, max_sequences=a.sequences, hidden=True)
    out = distill.run(target, a.minutes, a.heads, a.vocab or 2048, a.sequences)
    print(f"specwise: saved to {out}; draft with --drafter heads (or among them, with --k auto)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`heads` and its subcommands."""
    from specwise import eagle_training

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
    ht.add_argument("--width", type=int, help=f"the eagle layer's width ({WIDTH})")
    ht.add_argument(
        "--depth", type=int, help=f"draft depth the eagle layer is trained to ({DEPTH})"
    )
    ht.add_argument(
        "--from", dest="start", metavar="LAYER",
        help="eagle: train this layer further on the data here instead of a new one: shipped "
        "(the one specwise ships for the target), installed (the one trained here) or a layer "
        "file; its vocabulary and shape are kept, its earlier trainings recorded",
    )
    ht.add_argument("--sequences", type=int, default=8, help="answers generated at once (8)")
    ht.add_argument(
        "--lr", type=float,
        help=f"eagle: the schedule's peak learning rate (AdamW; default {eagle_training.LR})",
    )
    ht.add_argument(
        "--epochs", type=float,
        help="eagle: passes over the data (default: --minutes of training instead)",
    )
    ht.add_argument(
        "--positions", type=int,
        help="eagle: train on about this many positions of the data (a fixed subset; default all)",
    )
    ht.add_argument(
        "--kinds", default=ALL_KINDS,
        help="eagle: the data's sequences to train on, comma separated: read (the corpus, teacher "
        "forced), answer (the target's own answers); default both",
    )
    ht.add_argument(
        "--replace", action="store_true",
        help="eagle: install the new layer even where the one installed scores higher on the "
        "bench's answers (else the new one is saved beside it)",
    )
    ht.add_argument(
        "--curve", action="store_true",
        help="eagle: score the layer held out and on the bench's prompts each time the "
        f"positions seen double from {CURVE_FIRST} (the learning curve)",
    )
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
        "--answers", type=float, default=0.5,
        help="share of the positions the target answers by decoding, the rest read (0.5)",
    )
    hd.add_argument("--minutes", type=float, help="stop after this long (default: no limit)")
    hd.add_argument("--sequences", type=int, default=16, help="answers decoded at once (16)")
    hd.add_argument(
        "--invent", type=int, default=0, metavar="N",
        help="first have the target answer N invention prompts (lists of users' asks, and "
        "texts to summarize, translate, explain or edit, about everyday subjects), then the "
        "asks made of them; all of it is trained on (default 0)",
    )
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
    hp = hsub.add_parser(
        "ship",
        help="make the eagle layer trained here the one specwise ships for the target "
        "(into the package's trained/ folder, with its manifest; for developers)",
    )
    _heads_target_args(hp)
    h.set_defaults(func=cmd_heads)
