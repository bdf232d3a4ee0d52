"""Training the Medusa heads on the target's final hidden states on this machine (`specwise
heads train`): self-distillation data from the target, the reduced vocabulary, and the training
loop. (The eagle drafter's layer learns from `teacher`'s data, `eagle_training`.)

1. **Prompts** (`asks.code_prompts`) come from text every Python install ships: the functions of
   the standard library that have docstrings, asked for in the ways the bench's categories ask
   (write it from its description, explain it, edit it, summarize its documentation; write it,
   or translate it, in another language of `asks.LANGUAGES`). No shipped bench prompt is
   used: a prompt sharing any run of `corpus.SHINGLE` words with one is dropped.
2. **Data** (`generate`): the target answers them, several sequences per forward, greedily and
   at temperature 0.7 in turn. At every generated position t it keeps the hidden state h_t
   that predicted token t+1, the target's top `TOP` probabilities there and the token t+1 it
   emitted, in shards under the work folder, so that an interrupted run resumes where it
   stopped.
3. **Vocabulary** (`choose_vocab`): the `vocab` target tokens the target emitted most often in
   that data (top-1 of every kept distribution), ties by id; the network can name only these.
4. **Training** (`train`): head i at position t learns the target's distribution at t+i (the
   i-th token after the one h_t predicted), soft cross-entropy over the reduced vocabulary,
   AdamW, for the time left; the last tenth of the sequences is held out and scored
   (`evaluate`: how often each head's argmax is the target's, alone and as a chain; `score`:
   a saved network's, greedy and sampled answers apart). A checkpoint after each epoch lets a
   stopped run go on.

The result is saved next to the model's other measured state (`heads_path`). This module
measures no speed; the bench does.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specwise.asks import code_prompts
from specwise.backends.base import LM, new_sequence
from specwise.drafters.heads import Heads, heads_path, model_key, vocab_index
from specwise.sampling import Sampler, SamplingParams, warp
from specwise.weights import unembedding

__all__ = [
    "Data",
    "choose_vocab",
    "evaluate",
    "generate",
    "load_data",
    "run",
    "soft_loss",
    "train",
]

TOP = 16  # target probabilities kept per position
HEADS_FILE = "heads.pt"  # what `run` saves, in `heads_path`
SAMPLED = SamplingParams(temperature=0.7)  # how the odd prompts' answers are drawn


HEADS_LR = 1e-3  # AdamW's rate for the heads (`train`, and the server's adaptation of them)


@dataclass
class Data:
    """Positions of generated text: hidden states [n, d] (float16), the target's top TOP ids
    [n, TOP] and probabilities [n, TOP] at each, the answer each belongs to [n] (an answer's
    positions are consecutive, and no two answers share a number), the token that followed
    each [n] (-1: not recorded) and whether its answer was greedy [n] (else sampled)."""

    hidden: np.ndarray
    top_ids: np.ndarray
    top_probs: np.ndarray
    seq: np.ndarray
    tokens: np.ndarray
    greedy: np.ndarray

    def __len__(self) -> int:
        return len(self.seq)


def _top(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The TOP most likely ids of a logits row, most likely first, and their probabilities
    (float16)."""
    p = warp(logits, SamplingParams(temperature=1.0))
    n = min(TOP, len(p))
    ids = np.argpartition(p, -n)[-n:]
    ids = ids[np.argsort(-p[ids], kind="stable")]
    probs = p[ids]
    if n < TOP:  # a vocabulary smaller than TOP: the first id again, with probability 0
        ids = np.concatenate([ids, np.full(TOP - n, ids[0])])
        probs = np.concatenate([probs, np.zeros(TOP - n)])
    return ids.astype(np.int32), probs.astype(np.float16)


def generate(
    target: LM,
    prompts: Sequence[str],
    seconds: float,
    folder: Path,
    sequences: int = 8,
    max_tokens: int = 192,
    progress: Callable[[str], None] | None = None,
) -> None:
    """The target answers `prompts` in turn, skipping those `folder`'s earlier calls asked
    (known by their text, so a changed list resumes without asking a prompt twice), `sequences`
    at a time, until `seconds` have passed in this call; each finished answer's positions go to
    a shard of `folder` (answers unfinished at the end are dropped). A prompt's answer is greedy
    for even prompts, at temperature 0.7 for odd ones (seeded by its index)."""
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    state_path = folder / "progress.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    asked = state.get("asked") or [_digest(p) for p in prompts[: state.get("next", 0)]]
    # (a folder written before prompts were known by their text counted them on this list)
    done = set(asked)
    todo = [i for i, p in enumerate(prompts) if _digest(p) not in done]
    tok = target.tokenizer
    if tok is None:
        raise ValueError("training heads needs the target's tokenizer (its chat template)")
    start = time.perf_counter()
    live: dict[int, dict] = {}  # seq -> its prompt index, rng, tokens and records
    pending: list[dict] = []
    bar = tqdm(total=int(seconds), desc="self-distillation data", unit="s", file=sys.stderr)

    def begin(i: int) -> None:
        asked.append(_digest(prompts[i]))  # asked, even if its answer is left unfinished
        seq = new_sequence(target)
        ids = tok.render_chat([{"role": "user", "content": prompts[i]}])
        row = target.forward([(seq, ids)], last_only=True)[0][-1]
        live[seq] = {"i": i, "sampler": Sampler(i), "records": [], "n": 0}
        step(seq, row)

    def step(seq: int, row: np.ndarray) -> None:
        s = live[seq]
        h = target.hidden(seq)
        ids, probs = _top(row)
        greedy = s["i"] % 2 == 0
        x = int(np.argmax(row)) if greedy else s["sampler"].categorical(warp(row, SAMPLED))
        s["records"].append((h.astype(np.float16), ids, probs, x))
        s["n"] += 1
        s["next"] = x
        if x in target.eos_token_ids or s["n"] >= max_tokens:
            target.release(seq)
            pending.append(live.pop(seq))

    try:
        while time.perf_counter() - start < seconds and (live or todo):
            while len(live) < sequences and todo:
                begin(todo.pop(0))
            if live:
                seqs = list(live)
                rows = target.forward([(q, [live[q]["next"]]) for q in seqs])
                for q, r in zip(seqs, rows, strict=True):
                    step(q, r[-1])
            if len(pending) >= 16:
                _write_shard(folder, pending)
                pending.clear()
            now = min(int(seconds), int(time.perf_counter() - start))
            if now > bar.n:
                bar.update(now - bar.n)
    finally:
        for q in list(live):
            target.release(q)
        bar.close()
    _write_shard(folder, pending)
    state = {"asked": asked, "seconds": state.get("seconds", 0.0) + time.perf_counter() - start}
    state_path.write_text(json.dumps(state))  # answers left unfinished are dropped, not asked again
    if progress:
        progress(f"{len(load_data(folder))} positions from {len(asked)} prompts")


def _digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _write_shard(folder: Path, answers: list[dict]) -> None:
    if not answers:
        return
    n = len(list(folder.glob("shard-*.npz")))
    hidden, ids, probs, seq, tokens = [], [], [], [], []
    for a in answers:
        for h, i, p, x in a["records"]:
            hidden.append(h)
            ids.append(i)
            probs.append(p)
            seq.append(a["i"])
            tokens.append(x)
    tmp = folder / f"shard-{n:05d}.partial.npz"
    np.savez(
        tmp,
        hidden=np.stack(hidden),
        ids=np.stack(ids),
        probs=np.stack(probs),
        seq=seq,
        tokens=np.asarray(tokens, dtype=np.int32),
    )
    tmp.replace(folder / f"shard-{n:05d}.npz")


def load_data(folder: Path) -> Data:
    """Every shard in `folder`, in order. A shard names each position's answer by its prompt's
    index in the list it was asked from (`generate`), which another list may use again: the
    answers are numbered anew here, in the order of those indices."""
    shards = [np.load(p) for p in sorted(folder.glob("shard-?????.npz"))]
    if not shards:
        raise ValueError(f"{folder} holds no self-distillation data yet")
    seq = [np.asarray(s["seq"], dtype=np.int64) for s in shards]
    prompt = np.concatenate(seq)
    return Data(
        np.concatenate([s["hidden"] for s in shards]),
        np.concatenate([s["ids"] for s in shards]),
        np.concatenate([s["probs"] for s in shards]),
        _answers(seq),
        np.concatenate([_followed(s, q) for s, q in zip(shards, seq, strict=True)]),
        prompt % 2 == 0,  # `generate`'s rule
    )


def _answers(seq: Sequence[np.ndarray]) -> np.ndarray:
    """One number per answer for the shards' prompt indices `seq`: an answer is a run of one
    index within a shard; numbered by (index, place), so a folder asked from one list keeps
    its indices' order."""
    shard = np.concatenate([np.full(len(q), k) for k, q in enumerate(seq)])
    prompt = np.concatenate(seq)
    new = np.r_[True, (np.diff(prompt) != 0) | (np.diff(shard) != 0)]
    run = np.cumsum(new) - 1
    order = np.lexsort((np.arange(int(new.sum())), prompt[new]))
    number = np.empty_like(order)
    number[order] = np.arange(len(order))
    return number[run]


def _followed(shard, seq: np.ndarray) -> np.ndarray:
    """The token that followed each position of a shard: recorded, or, in shards written
    before tokens were, the target's top token in greedy answers (even prompts) and -1 in
    sampled ones."""
    if "tokens" in shard:
        return np.asarray(shard["tokens"], dtype=np.int64)
    return np.where(seq % 2 == 0, shard["ids"][:, 0], -1).astype(np.int64)


def choose_vocab(data: Data, size: int, always: Sequence[int] = ()) -> np.ndarray:
    """The `size` ids the target put first most often in `data` (ties by lower id), plus
    `always` (e.g. end-of-text ids), sorted."""
    counts = np.bincount(data.top_ids[:, 0], minlength=int(data.top_ids.max()) + 1)
    order = np.lexsort((np.arange(len(counts)), -counts))
    picked = [int(i) for i in order[:size] if counts[i] > 0]
    return np.array(sorted(set(picked) | {int(x) for x in always}), dtype=np.int64)


def _targets(data: Data, ids: np.ndarray, vocab_size: int, n_heads: int):
    """For every position t and head i: the index of position t+i (or -1 past its sequence's
    end) and, per position, its kept distribution over the reduced vocabulary (dense rows are
    built per batch): (label position [n, H], reduced ids [n, TOP], probabilities [n, TOP])."""
    where = vocab_index(ids, vocab_size)
    n = len(data)
    label = np.full((n, n_heads), -1, dtype=np.int64)
    for i in range(1, n_heads + 1):
        t = np.arange(n - i)
        same = data.seq[t + i] == data.seq[t]
        label[t[same], i - 1] = t[same] + i
    red = where[data.top_ids]
    probs = np.where(red >= 0, data.top_probs.astype(np.float32), 0.0)
    return label, red, probs


def _split(data: Data, held_out: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the training sequences and of the held-out last tenth."""
    seqs = np.unique(data.seq)
    cut = seqs[int(len(seqs) * (1 - held_out))] if len(seqs) > 1 else seqs[-1] + 1
    idx = np.arange(len(data))
    return idx[data.seq < cut], idx[data.seq >= cut]


def _dense(red: np.ndarray, probs: np.ndarray, rows: np.ndarray, width: int):
    """[len(rows), width] label distributions (renormalised; all zero where no kept id is in
    the reduced vocabulary)."""
    import torch

    out = torch.zeros(len(rows), width)
    r = torch.from_numpy(red[rows]).clamp(min=0)
    p = torch.from_numpy(probs[rows])
    out.scatter_add_(1, r, p)
    total = out.sum(dim=1, keepdim=True)
    return torch.where(total > 0, out / total.clamp(min=1e-12), out)


def soft_loss(logits, target):
    """The networks' loss: mean cross-entropy of logits [B, H, N] against label distributions
    [B, H, N] (torch tensors) over the (row, head) pairs whose label has mass, None where none
    has; the layer's [B, L, N], over the (answer, position) pairs. (A one-hot label is a token
    the target emitted.)"""
    import torch

    has = target.sum(dim=-1) > 0  # [B, H]
    if not bool(has.any()):
        return None
    logp = torch.log_softmax(logits[has], dim=-1)
    return -(target[has] * logp).sum() / int(has.sum())


def train(
    heads: Heads,
    data: Data,
    seconds: float,
    checkpoint: Path | None = None,
    batch: int = 256,
    lr: float = HEADS_LR,
    seed: int = 0,
) -> dict:
    """Train `heads` on `data` for about `seconds` (whole epochs while time is left, at least
    one), resuming from `checkpoint` where it holds one; returns `evaluate` on the held-out
    sequences and what was done."""
    import torch

    label, red, probs = _targets(data, heads.ids, heads.vocab_size, heads.n_heads)
    fit, held = _split(data)
    fit = fit[(label[fit] >= 0).any(axis=1)]
    hidden = torch.from_numpy(data.hidden)

    def batches(rng):
        order = rng.permutation(fit)
        for b in range(0, len(order), batch):
            rows = order[b : b + batch]
            lab = label[rows]  # [B, H]
            target = torch.zeros(len(rows), heads.n_heads, len(heads.ids))
            for i in range(heads.n_heads):
                ok = lab[:, i] >= 0
                if ok.any():
                    target[torch.from_numpy(ok), i] = _dense(red, probs, lab[ok, i], len(heads.ids))
            yield soft_loss(heads.module(hidden[rows].float()), target)

    key = _data_key(data, heads.ids)
    epochs = _fit(heads.module, batches, seconds, checkpoint, key, lr, seed, "training heads")
    heads.publish()
    return {
        "epochs": epochs,
        "train_positions": len(fit),
        "held_out_positions": len(held),
        **evaluate(heads, data, held, label),
    }


def _data_key(data: Data, ids: np.ndarray) -> dict:
    """What a checkpoint was trained on: how many positions, and the vocabulary."""
    return {"positions": len(data), "ids": [int(i) for i in ids]}


def _fit(
    module,
    batches,
    seconds: float,
    checkpoint: Path | None,
    key: dict,
    lr: float,
    seed: int,
    desc: str,
):
    """The training loop: AdamW on the losses `batches(rng)` yields (None: skip), whole epochs
    while `seconds` are left (at least one), a checkpoint after each; returns the epochs done
    (counting those of the checkpoint it resumed from). A checkpoint resumes only where it
    was written for the same `key` (the data and the vocabulary); another is started afresh.
    Leaves `module` in eval mode."""
    import torch
    from tqdm import tqdm

    module.train()
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    epoch = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if state.get("key") == key:
            module.load_state_dict(state["weights"])
            opt.load_state_dict(state["optimizer"])
            epoch = int(state["epoch"])
        else:
            print(
                f"{checkpoint.name} was trained on other data or another vocabulary; "
                "training from the start",
                file=sys.stderr,
            )
    rng = np.random.default_rng(seed + epoch)
    start = time.perf_counter()
    bar = tqdm(total=max(1, int(seconds)), desc=desc, unit="s", file=sys.stderr)
    while True:
        t0 = time.perf_counter()
        for loss in batches(rng):
            if loss is None:
                continue
            opt.zero_grad()
            loss.backward()
            opt.step()
            now = min(bar.total, int(time.perf_counter() - start))
            if now > bar.n:
                bar.update(now - bar.n)
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.3f}")
        epoch += 1
        per_epoch = time.perf_counter() - t0
        if checkpoint is not None:  # atomically: a run stopped while saving keeps the last one
            tmp = checkpoint.with_suffix(".partial")
            torch.save(
                {
                    "weights": module.state_dict(),
                    "optimizer": opt.state_dict(),
                    "epoch": epoch,
                    "key": key,
                },
                tmp,
            )
            tmp.replace(checkpoint)
        if time.perf_counter() - start + per_epoch > seconds:
            break
    bar.close()
    module.eval()
    return epoch


def evaluate(heads: Heads, data: Data, rows: np.ndarray, label: np.ndarray | None = None) -> dict:
    """How often each head's argmax is the target's top token at its position, over `rows`
    that have one (`alone`), and how often heads 1..i are all right (`chain`: the expected
    share of greedy chains accepted at least that far)."""
    import torch

    if label is None:
        label = _targets(data, heads.ids, heads.vocab_size, heads.n_heads)[0]
    rows = rows[(label[rows] >= 0).all(axis=1)]
    if len(rows) == 0:
        return {"alone": [], "chain": [], "scored": 0}
    right = np.zeros((len(rows), heads.n_heads), dtype=bool)
    with torch.inference_mode():
        for b in range(0, len(rows), 1024):
            r = rows[b : b + 1024]
            logits = heads.module(torch.from_numpy(data.hidden[r]).float()).numpy()
            guess = heads.ids[np.argmax(logits, axis=-1)]  # [B, H]
            want = data.top_ids[label[r], 0]  # [B, H]
            right[b : b + len(r)] = guess == want
    chain = np.cumprod(right, axis=1)
    return {
        "alone": [round(float(x), 4) for x in right.mean(axis=0)],
        "chain": [round(float(x), 4) for x in chain.mean(axis=0)],
        "scored": len(rows),
    }


def score(net: Heads, data: Data) -> dict[str, dict]:
    """How often trained heads' first head's argmax is the target's token, on the held-out
    answers (`_split`): over all of them, and over the greedy (even prompts) and the sampled
    (odd) answers apart; each `evaluate`'s result."""
    held = _split(data)[1]
    kinds = {
        "all": held,
        "greedy": held[data.greedy[held]],
        "sampled": held[~data.greedy[held]],
    }
    return {kind: evaluate(net, data, rows) for kind, rows in kinds.items()}


def run(
    target: LM,
    minutes: float,
    n_heads: int = 3,
    vocab: int = 2048,
    sequences: int = 8,
    data_share: float = 0.6,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> Path:
    """Train `n_heads` Medusa heads for `target` (a GGUF target built with hidden states) in
    about `minutes`: `data_share` of them generating data (less where earlier runs left data),
    the rest training; saved to `heads_path(...)/heads.pt`, whose path it returns."""
    if not target.hidden_size:
        raise ValueError("training heads needs a target built with hidden states")
    model = Path(target.info.model)
    folder = heads_path(model)
    work = folder / "work"
    budget = minutes * 60.0
    state = work / "progress.json"
    spent = json.loads(state.read_text()).get("seconds", 0.0) if state.exists() else 0.0
    left = max(0.0, budget * data_share - spent)
    if left > 0:
        prompts = code_prompts(limit=1500)
        progress(
            f"generating self-distillation data for {left / 60:.1f} min ({len(prompts)} prompts)"
        )
        generate(target, prompts, left, work, sequences=sequences, progress=progress)
    data = load_data(work)
    ids = choose_vocab(data, vocab, always=sorted(target.eos_token_ids))
    progress(
        f"{len(data)} positions; a vocabulary of {len(ids)} tokens covers "
        f"{_coverage(data, ids):.1%} of the target's top tokens"
    )
    meta = {"key": model_key(model)[:20], "model": model.name}
    rows = unembedding(target, ids)
    seconds = max(60.0, budget * (1 - data_share))
    net = Heads(target.hidden_size, n_heads, ids, target.vocab_size, unembedding=rows, meta=meta)
    result = train(net, data, seconds, checkpoint=work / f"train-{n_heads}-{len(ids)}.pt")
    net.meta.update(trained=time.strftime("%Y-%m-%dT%H:%M:%S"), positions=len(data), **result)
    out = folder / HEADS_FILE
    net.save(out)
    progress(
        f"held-out: each head's argmax is the target's {result['alone']} of the time; "
        f"chains right to depth 1..{n_heads}: {result['chain']}"
    )
    return out


def _coverage(data: Data, ids: np.ndarray) -> float:
    return float(np.isin(data.top_ids[:, 0], ids).mean())
