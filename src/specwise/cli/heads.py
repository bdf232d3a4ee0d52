"""`specwise heads`, every subcommand of it: the drafting networks on the target's hidden
states trained (`train`: the heads by `distill`, the eagle layer by `eagle_training`), the eagle
layer's data made (`data`, by `teacher`) and their held-out scores (`score`), with their flags
and what they print.

No training, data or scoring logic: those modules hold it.
"""

from __future__ import annotations

import argparse
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
            got = eagle_training.evaluate(net, data)
            kinds = ", ".join(f"{k} {v['alpha']}" for k, v in got["by_kind"].items())
            print(
                f"{f}: trained on {net.meta.get('positions', '?')} positions; held out, its "
                f"argmax is the target's token at depths 1..{net.depth} {got['alpha']} over "
                f"{got['scored_positions']} positions ({kinds}); greedy answers' chain τ "
                f"{got['chain_accepted']}"
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
          f"{result['alpha']}; greedy answers' chain τ {result['chain_accepted']}")
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`heads` and its subcommands."""
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
