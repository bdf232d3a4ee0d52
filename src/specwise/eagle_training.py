"""Training the eagle drafter's layer (`drafters.eagle.Layer`) on the teacher's data
(`specwise.teacher`), and scoring it on the held-out sequences.

- **Vocabulary** (`choose_vocab`): the `size` ids the target put first most often at the
  training positions, plus its end-of-text ids; the layer can name only these, and a copy
  (`drafters.eagle_layer`'s copy slot).
- **Batches**: windows of up to `WINDOW` positions of training sequences (not held out), a
  few a step. Position i of a window reads its states, the token after it and that token's
  copy (`copies`: `ngram.continuations` within its sequence, prompt included); at draft depth
  j (1..depth) it learns the target's distribution at position i + j, its top `teacher.K`
  ids renormalised over the columns the layer can name (the reduced vocabulary, and the copy
  slot where the label is the position's unnamed copy; where none of them is, or the label is
  not trained on, the position teaches nothing at that depth).
- **Training-time test** (`LayerModule.unroll`): depth j >= 2 runs the layer on its own
  feature from depth j - 1, attending to the committed positions and to its own path, as it
  drafts; the loss is a weighted mean of the depths' soft cross-entropies (`DEPTH_WEIGHT`^(j-1)),
  each with `REGRESSION` times the distance of the depth's predicted state ŝ to the target's
  own top state where the label is (EAGLE's feature regression: a dense target that the
  next depth reads; measured on 70k positions, α1 on the bench answers 0.227 against 0.216
  without it, α2 0.161 against 0.151).
- **Data size** (`training_sequences`): all the training sequences, or a fixed random
  subset of about n positions that every larger subset contains (the learning curve's).
- **Schedule**: AdamW at `lr`, a short warm-up, then down linearly to a tenth over the time
  or the epochs given; a checkpoint beside the data every few minutes and at the end, from
  which a stopped run goes on (the same vocabulary, shape, start and subset; epochs count from
  the first step, so a resumed run ends where the first would have).
- **Precision** (`faster_in_bf16`): the first steps alternate float32 and bfloat16 products
  (autocast; the weights stay float32) and the rest run in whichever this CPU ran faster.
- **Score** (`evaluate`): on held-out sequences, by depth, how often the layer's argmax is the
  target's top token there (the data's earlier tokens given), over all, over read and over
  answered sequences apart, by the category of a bench answer (`teacher.bench_answers`), and
  for greedy answers (where the data's tokens are the target's own argmaxes, so a drafted
  chain is accepted exactly as far as its depths are right in a row) the mean accepted
  length of a chain (`chain_accepted`: accepted tokens per drafted round, the bonus token
  not counted).

This module times only its own training steps (to choose their precision); the bench
measures drafting speed.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specwise.drafters.eagle import Layer
from specwise.drafters.eagle_layer import COPY_N, FORMAT
from specwise.drafters.heads import vocab_index
from specwise.drafters.ngram import continuations
from specwise.teacher import Data

__all__ = [
    "DEPTH_WEIGHT", "FINAL_LR", "LR", "WINDOW", "choose_vocab", "copies", "evaluate", "lineage",
    "outscores", "train",
]

WINDOW = 512  # most positions of one training window
DEPTH_WEIGHT = 0.8  # depth j's loss weighs DEPTH_WEIGHT ** (j - 1)
REGRESSION = 1.0  # the predicted state's distance to the target's, beside the cross-entropy
LR = 2e-3
FINAL_LR = LR / 10  # where the schedule ends: the rate the server adapts the layer at
WARMUP = 50  # steps
CHECKPOINT_S = 300.0


def choose_vocab(data: Data, size: int, always: Sequence[int] = ()) -> np.ndarray:
    """The `size` ids the target put first most often at the training positions of `data`
    (ties by lower id), plus `always`, sorted."""
    keep = data.train & ~np.repeat(data.held_out(), data.lengths)
    top = data.label_ids[keep, 0].astype(np.int64)
    counts = np.bincount(top, minlength=int(top.max(initial=0)) + 1)
    order = np.lexsort((np.arange(len(counts)), -counts))
    picked = [int(i) for i in order[:size] if counts[i] > 0]
    return np.array(sorted(set(picked) | {int(x) for x in always}), dtype=np.int64)


def coverage(data: Data, ids: np.ndarray) -> float:
    """The share of the training positions whose target top token is in `ids`."""
    keep = data.train & ~np.repeat(data.held_out(), data.lengths)
    return float(np.isin(data.label_ids[keep, 0], ids).mean()) if keep.any() else 0.0


def _windows(data: Data, sequences: np.ndarray, rng: np.random.Generator | None):
    """(first, end) position ranges of at most WINDOW positions covering `sequences`: each
    sequence cut into consecutive windows (with `rng`, the cuts start at a random offset)."""
    out = []
    for q in sequences:
        a, n = int(data.starts[q]), int(data.lengths[q])
        shift = int(rng.integers(0, WINDOW)) if rng is not None and n > WINDOW else 0
        cuts = [0, *range(shift or WINDOW, n, WINDOW), n] if n > WINDOW else [0, n]
        out.extend((a + x, a + y) for x, y in itertools.pairwise(cuts) if y - x > 1)
    return out


def copies(data: Data) -> tuple[np.ndarray, np.ndarray]:
    """Each position's copy (`ngram.continuations` over its sequence up to it, the layer's
    `COPY_N`): target ids [n] (-1: none) and match lengths [n]; computed once a `Data`."""
    cached = getattr(data, "_copies", None)
    if cached is None:
        ids = np.full(len(data), -1, dtype=np.int64)
        sizes = np.zeros(len(data), dtype=np.int64)
        for a, n in zip(data.starts.tolist(), data.lengths.tolist(), strict=True):
            span = slice(a, a + n)
            ids[span], sizes[span] = continuations(data.tokens[span].tolist(), COPY_N)
        cached = data._copies = (ids, sizes)
    return cached


def _batch(layer: Layer, data: Data, windows, depth: int):
    """Tensors for `windows`: states [B, L, S], token indices [B, L + depth - 1] and their
    copies' indices and match lengths (as the tokens), per depth j
    the label columns [B, L, K] (`Layer.columns`: the reduced vocabulary's and the copy
    slot's; 0 where none) with
    their weights [B, L, K] (renormalised probabilities; all 0: no label), and the target's
    top state at each position's depth-j successor [depth, B, L, d] (zero past the
    sequence's end: `_loss` reads it where the label's weights are)."""
    import torch

    width = max(e - a for a, e in windows)
    n_ids = len(layer.ids)
    d = layer.hidden_size
    s = torch.zeros(len(windows), width, layer.state_size)
    t = torch.full((len(windows), width + depth - 1), n_ids, dtype=torch.long)
    c = torch.full_like(t, n_ids)
    n = torch.zeros_like(t)
    copy_ids, copy_sizes = copies(data)
    cols = torch.zeros(depth, len(windows), width, data.label_ids.shape[1], dtype=torch.long)
    wts = torch.zeros(depth, len(windows), width, data.label_ids.shape[1])
    tops = torch.zeros(depth, len(windows), width, d)
    for b, (a, e) in enumerate(windows):
        m = e - a
        seq_end = _sequence_end(data, a)
        ahead = torch.from_numpy(data.states(a, min(seq_end, e + depth)).astype(np.float32))
        s[b, :m] = ahead[:m]
        for j in range(depth):  # the state that predicts the depth-j label, at i + 1 + j
            nxt = ahead[1 + j : m + 1 + j, -d:]
            tops[j, b, : len(nxt)] = nxt
        lo, hi = a + 1, min(seq_end, e + depth)
        t[b, : hi - lo] = torch.from_numpy(layer.index(data.tokens[lo:hi]))
        c[b, : hi - lo] = torch.from_numpy(layer.index(copy_ids[lo:hi]))
        n[b, : hi - lo] = torch.from_numpy(copy_sizes[lo:hi])
        for j in range(depth):
            lo, hi = a + 1 + j, min(seq_end, e + 1 + j)
            if hi <= lo:
                continue
            red = layer.columns(data.label_ids[lo:hi], copy_ids[lo:hi], copy_sizes[lo:hi])
            p = np.where(red >= 0, data.label_probs[lo:hi].astype(np.float32), 0.0)
            p = p * data.train[lo:hi, None]
            total = p.sum(axis=1, keepdims=True)
            p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
            cols[j, b, : hi - lo] = torch.from_numpy(red.clip(min=0))
            wts[j, b, : hi - lo] = torch.from_numpy(p)
    return s, t, c, n, cols, wts, tops


def _sequence_end(data: Data, position: int) -> int:
    q = int(np.searchsorted(data.starts, position, side="right")) - 1
    return int(data.starts[q] + data.lengths[q])


def _loss(logits: list, cols, wts, predicted: list | None = None, tops=None):
    """The weighted mean over depths of the soft cross-entropy at labelled positions, plus
    `REGRESSION` times the smooth-L1 distance between each depth's predicted state and the
    target's own (both RMS-normalised) where they are given; None where no position has a
    label."""
    import torch

    total, weight = 0.0, 0.0
    for j, lg in enumerate(logits):
        has = wts[j].sum(-1) > 0  # [B, L]
        if not bool(has.any()):
            continue
        logp = torch.log_softmax(lg[has], dim=-1)  # [n, N]
        ce = -(torch.gather(logp, 1, cols[j][has]) * wts[j][has]).sum(-1).mean()
        if predicted is not None:
            ce = ce + REGRESSION * torch.nn.functional.smooth_l1_loss(
                _rms(predicted[j][has].float()), _rms(tops[j][has])
            )
        total = total + DEPTH_WEIGHT**j * ce
        weight += DEPTH_WEIGHT**j
    return None if weight == 0 else total / weight


def _rms(x):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def training_sequences(data: Data, positions: int | None = None) -> np.ndarray:
    """The sequences trained on (not held out, longer than one position); with `positions`,
    the first of them in a fixed random order that hold about that many positions (so a
    smaller set is part of every larger one, and each keeps the data's mix)."""
    fit = np.flatnonzero(~data.held_out() & (data.lengths > 1))
    if positions is None:
        return fit
    order = np.random.default_rng(0).permutation(fit)
    n = int(np.searchsorted(np.cumsum(data.lengths[order]), positions)) + 1
    return np.sort(order[:n])


def faster_in_bf16(timed: dict[bool, list[float]], steps: int = 3) -> bool | None:
    """Whether training steps run faster with bfloat16 products (torch's autocast) than in
    float32 on this CPU, from the seconds of `steps` steps of each (`timed[False]`: float32,
    `timed[True]`: bf16; the first of each is a warm-up, not counted): True where bf16's
    median is at least 10% lower; None until both have `steps` steps. Measured, never
    assumed from a CPU flag: without native bf16 products the emulation is slower."""
    if min(len(timed[False]), len(timed[True])) < steps:
        return None
    fp32, half = (float(np.median(timed[k][1:])) for k in (False, True))
    return half < 0.9 * fp32


def train(
    layer: Layer,
    data: Data,
    seconds: float | None = None,
    checkpoint: Path | None = None,
    batch: int = 2,
    lr: float = LR,
    seed: int = 0,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    epochs: float | None = None,
    positions: int | None = None,
    curve: Sequence[int] = (),
    judge: Callable[[Layer], dict] | None = None,
) -> dict:
    """Train `layer` on the training sequences of `data` (with `positions`, on about that
    many: `training_sequences`) for about `seconds`, or for `epochs` passes over them,
    resuming from `checkpoint` where it holds one for the same vocabulary, shape, start
    (`Layer.start`), training positions and `lr`; returns what was done and `evaluate` on the
    held-out sequences. With `curve` (positions seen) and `judge` (a layer -> its scores),
    the result's `curve` holds what `judge` said as the training passed each of them: in a
    first epoch, the layer trained on that many distinct positions, at the learning rate of
    that point of the schedule."""
    import torch
    from tqdm import tqdm

    if (seconds is None) == (epochs is None):
        raise ValueError("train for seconds or for epochs: give one of them")
    depth = layer.depth
    fit = training_sequences(data, positions)
    if len(fit) == 0:
        raise ValueError("the data holds no training sequence yet")
    total = int(data.lengths[fit].sum())
    module = layer.module
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    key = {"ids": [int(i) for i in layer.ids], "width": layer.width, "depth": depth,
           "layers": list(layer.layers), "positions": positions, "start": layer.start,
           "train_positions": total, "lr": lr, "format": FORMAT}
    step, seen, spent = 0, 0, 0.0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if state.get("key") == key:
            module.load_state_dict(state["weights"])
            opt.load_state_dict(state["optimizer"])
            step, seen, spent = state["step"], state["positions"], state.get("seconds", 0.0)
            progress(f"resuming from {checkpoint.name}: step {step}, {seen} positions seen")
        else:
            progress(f"{checkpoint.name} was trained for another vocabulary, shape, start or "
                     "learning rate; training from the start")
    rng = np.random.default_rng(seed + step)
    module.train()
    start = last_save = time.perf_counter()
    goal = seconds if seconds is not None else epochs * total
    bar = tqdm(total=max(1, int(goal)), desc="training the layer", file=sys.stderr,
               unit="s" if seconds is not None else "pos")
    windows: list = []
    ema = None
    timed: dict[bool, list[float]] = {False: [], True: []}  # step seconds, fp32 and bf16
    points = sorted(n for n in curve if n > seen)
    scored: list[dict] = []
    bf16: bool | None = None  # None: still measuring which is faster

    def done() -> float:  # the share of the budget spent (epochs: from the first step on)
        if seconds is not None:
            return (time.perf_counter() - start) / seconds
        return seen / goal

    def save() -> None:
        if checkpoint is None:
            return
        tmp = checkpoint.with_suffix(".partial")
        torch.save({"weights": module.state_dict(), "optimizer": opt.state_dict(),
                    "step": step, "positions": seen, "key": key,
                    "seconds": spent + time.perf_counter() - start}, tmp)
        tmp.replace(checkpoint)

    try:
        while done() < 1.0:
            if len(windows) < batch:
                windows.extend(_windows(data, rng.permutation(fit), rng))
            chosen, windows = windows[:batch], windows[batch:]
            s, t, c, n, cols, wts, tops = _batch(layer, data, chosen, depth)
            half = bf16 if bf16 is not None else len(timed[False]) > len(timed[True])
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half), \
                    warnings.catch_warnings():
                # RMSNorm's bf16 input beside its float32 weight: the unfused path, as intended
                warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")
                logits, predicted = module.unroll(s, t, c, n, depth, states=True)
            loss = _loss([x.float() for x in logits], cols, wts, predicted, tops)
            if loss is None:
                continue
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / WARMUP) * (1.0 - 0.9 * min(1.0, done()))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            opt.step()
            if bf16 is None:
                timed[half].append(time.perf_counter() - t0)
                bf16 = faster_in_bf16(timed)
            step += 1
            seen += sum(e - a for a, e in chosen)
            value = float(loss.detach())
            ema = value if ema is None else 0.98 * ema + 0.02 * value
            now = min(bar.total, int(done() * goal))
            if now > bar.n:
                bar.update(now - bar.n)
                bar.set_postfix(step=step, loss=f"{ema:.3f}", positions=seen)
            while points and seen >= points[0] and judge is not None:
                points.pop(0)
                module.eval()
                scored.append({"positions_seen": seen, "steps": step, **judge(layer)})
                module.train()
                said = [f"{k} α1 {v['alpha'][0]}" for k, v in scored[-1].items()
                        if isinstance(v, dict) and v.get("alpha")]
                progress(f"at {seen} positions seen: {', '.join(said)}")
            if time.perf_counter() - last_save > CHECKPOINT_S:
                save()
                last_save = time.perf_counter()
    finally:
        bar.close()
        module.eval()
        save()
    layer.publish()
    return {
        "steps": step,
        "positions_seen": seen,
        "train_positions": total,
        "seconds": round(spent + time.perf_counter() - start, 1),
        "precision": "bf16" if bf16 else "fp32",
        **({"curve": scored} if scored else {}),
        **evaluate(layer, data),
    }


def evaluate(layer: Layer, data: Data, limit: int = 200_000) -> dict:
    """How often the layer's argmax is the target's top token at each draft depth, on the
    held-out sequences (up to `limit` positions): `alpha` (depth 1..depth, each given the
    data's earlier tokens) over all of them, `by_kind` (read, answer, greedy answers),
    `chain_accepted` over greedy answers (module docstring), `in_vocabulary`: the share of
    the depth-1 positions whose top token the layer can name (in its vocabulary, or the
    position's copy: α1's ceiling), and `by_read`:
    α1 and the share of the positions by the token the position reads (one the layer names,
    any other: it reads those as one token)."""
    import torch

    depth = layer.depth
    held = np.flatnonzero(data.held_out() & (data.lengths > 1))
    groups: dict[str, list] = {"all": [], "read": [], "answer": [], "greedy": []}
    runs: dict[str, list] = {}  # per greedy-answer position: depths right in a row, by kind
    reads: list[tuple[np.ndarray, np.ndarray]] = []  # depth 1: (right, reads a named token)
    total = 0
    where = vocab_index(layer.ids, layer.vocab_size)
    copy_ids, copy_sizes = copies(data)
    with torch.inference_mode():
        for q in held:
            if total >= limit:
                break
            meta = data.meta[q]
            for a, e in _windows(data, np.array([q]), None):
                s, t, c, n, _, _, _ = _batch(layer, data, [(a, e)], depth)
                logits = layer.module.unroll(s, t, c, n, depth)
                m = e - a
                end = _sequence_end(data, a)
                right = np.zeros((m, depth), dtype=bool)
                valid = np.zeros((m, depth), dtype=bool)
                inside = np.zeros(m, dtype=bool)
                for j, lg in enumerate(logits):
                    lo, hi = a + 1 + j, min(end, e + 1 + j)
                    n = hi - lo
                    if n <= 0:  # a sequence shorter than the depth: nothing left to score
                        break
                    guess = layer.tokens(lg[0, :n].argmax(-1).numpy(), copy_ids[lo:hi])
                    want = data.label_ids[lo:hi, 0]
                    valid[:n, j] = data.train[lo:hi]
                    right[:n, j] = guess == want
                    if j == 0:
                        inside[:n] = layer.columns(want, copy_ids[lo:hi], copy_sizes[lo:hi]) >= 0
                        named = where[data.tokens[lo:hi]] >= 0
                        reads.append((right[:n, 0][valid[:n, 0]], named[valid[:n, 0]]))
                kinds = ["all", meta["kind"]] + (["greedy"] if meta.get("greedy") else [])
                kinds += [meta["category"]] if "category" in meta else []
                for kind in kinds:
                    groups.setdefault(kind, []).append((right, valid, inside))
                if meta.get("greedy"):
                    ok = valid.all(axis=1)
                    streak = np.cumprod(right[ok], axis=1).sum(axis=1).tolist()
                    for kind in ("all", *kinds[3:]):
                        runs.setdefault(kind, []).extend(streak)
                total += m
    out: dict = {"scored_positions": total, "by_kind": {}}
    for kind, parts in groups.items():
        if not parts:
            continue
        r = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        inside = np.concatenate([p[2] for p in parts])[v[:, 0]]
        out["by_kind"][kind] = {
            "alpha": [round(float(r[v[:, j], j].mean()), 4) if v[:, j].any() else None
                      for j in range(depth)],
            "positions": int(v[:, 0].sum()),
            "in_vocabulary": round(float(inside.mean()), 4) if len(inside) else None,
        }
        if runs.get(kind):
            out["by_kind"][kind]["chain_accepted"] = round(float(np.mean(runs[kind])), 3)
    if reads:
        r, named = (np.concatenate(x) for x in zip(*reads, strict=True))
        out["by_read"] = {
            name: {"alpha1": round(float(r[pick].mean()), 4), "share": round(float(pick.mean()), 4)}
            for name, pick in (("named", named), ("other", ~named)) if pick.any()
        }
    out["alpha"] = out["by_kind"].get("all", {}).get("alpha", [])
    out["chain_accepted"] = out["by_kind"].get("all", {}).get("chain_accepted")
    return out


def outscores(installed: dict, new: dict) -> bool:
    """Whether the layer whose record is `installed` scored a higher α1 than the one whose
    record is `new` on the same bench answers (each record's `bench`: `evaluate` on them; the
    same answers: as many positions scored). Records without a bench score do not compare."""
    a, b = installed.get("bench") or {}, new.get("bench") or {}
    if not a.get("alpha") or not b.get("alpha"):
        return False
    if a.get("scored_positions") != b.get("scored_positions"):
        return False
    return a["alpha"][0] > b["alpha"][0]


def lineage(record: dict) -> list[dict]:
    """The trainings a layer went through, oldest first, from its record (`<layer>.json` or
    the layer's meta): the record's own `history` and then the record itself, each as when it
    was trained, where, on how many positions and seen how often, and its bench α1. A layer
    trained further from this one (`heads train --from`) keeps this as its `history`, so its
    positions seen in all are the sum over it (data made on machines long gone included)."""
    bench = (record.get("bench") or {}).get("alpha") or [None]
    own = {k: record.get(k) for k in ("trained", "machine", "positions", "positions_seen", "kinds")}
    return [*record.get("history", []), {**own, "bench_alpha1": bench[0]}]


def save_result(path: Path, result: dict) -> None:
    """Write a training's result beside its layer (`<layer>.json`), for the manifest."""
    path.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
