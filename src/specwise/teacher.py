"""The target as teacher: the data a drafter on the target's layer states learns from, made
two ways and kept in shards that a stopped run resumes from.

- **read** (`read`, teacher forcing): the target reads chunks of the local corpus
  (`specwise.corpus`), each framed as the answer of a chat turn, in forwards of up to n_batch
  tokens that compute no logits (`LM.read`: the graph stops at the final norm); the target's
  distribution at each position is its final state times the output rows of the label
  vocabulary (`LABEL_VOCAB`), computed here.
- **answer** (`answer`, decoding): the target answers asks (`specwise.asks`), several
  sequences a forward, greedily for even prompts and at temperature 0.7 for odd ones; its
  distribution at each position is its own softmax.

At every position t of a sequence a shard keeps the layer states s_t (float16 [n, S], S =
layers x width), the token x_t, the target's top `K` ids and probabilities for x_{t+1}, whether
that label is trained on (`train`: positions of the answer, not of the prompt; the last
position of a sequence has no next token and is not), and the target's argmax over its whole
vocabulary where it is known (`top1`, answers; -1 elsewhere). (A layer drafting at t reads s_t
and x_{t+1} and learns the label of t+1.) Each sequence's source, document
and held-out flag (`corpus.held_out`) are in the shard's `meta.json`. `Data` memory-maps the
shards of a folder (a million positions are ~9 GB of states).

This module measures data rates (positions per second of each way, `Writer.rate`), not speed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specwise.backends.base import LM, new_sequence
from specwise.sampling import Sampler, SamplingParams, warp

__all__ = [
    "KINDS",
    "LABEL_VOCAB",
    "SAMPLED",
    "Data",
    "K",
    "Writer",
    "answer",
    "answer_invented",
    "bench_answers",
    "bench_complete",
    "collect",
    "label_ids",
    "read",
    "replies",
    "summary",
]

K = 8  # target probabilities kept per position
LABEL_VOCAB = 32768  # the label vocabulary: ids below this (a BPE's most frequent), + specials
SAMPLED = SamplingParams(temperature=0.7)  # how the odd prompts' answers are drawn
KINDS = ("read", "answer")
SHARD_POSITIONS = 16384  # positions a shard holds before it is written


def label_ids(target: LM) -> np.ndarray:
    """The ids whose probabilities `read` computes: those below LABEL_VOCAB and every end of
    text id (a chat template's end of turn among them)."""
    n = min(LABEL_VOCAB, target.vocab_size)
    extra = sorted(i for i in target.eos_token_ids if i >= n)
    return np.array([*range(n), *extra], dtype=np.int64)


@dataclass
class _Seq:
    meta: dict
    states: list[np.ndarray] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    label_ids: list[np.ndarray] = field(default_factory=list)
    label_probs: list[np.ndarray] = field(default_factory=list)
    train: list[np.ndarray] = field(default_factory=list)
    top1: list[np.ndarray] = field(default_factory=list)


class Writer:
    """Writer(folder): appends finished sequences of each kind and writes them as shards
    `<kind>-NNNNN/` of about SHARD_POSITIONS positions (atomically: a shard is a folder renamed
    into place), keeping the folder's `progress.json`: per kind, the digests of what was taken
    (chunks, prompts), the positions written and the seconds spent."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "progress.json"
        self.state = json.loads(path.read_text()) if path.exists() else {}
        for kind in KINDS:
            self.state.setdefault(kind, {"done": [], "seconds": 0.0, "positions": 0})
        self._done = {k: set(self.state[k]["done"]) for k in KINDS}
        self._pending: dict[str, list[_Seq]] = {k: [] for k in KINDS}

    def done(self, kind: str, key: str) -> bool:
        return key in self._done[kind]

    def mark(self, kind: str, key: str) -> None:
        """`key` (a chunk's or a prompt's digest) was taken: never again, finished or not."""
        if key not in self._done[kind]:
            self._done[kind].add(key)
            self.state[kind]["done"].append(key)

    def add(self, kind: str, seq: _Seq) -> None:
        self._pending[kind].append(seq)
        if sum(len(s.tokens) for s in self._pending[kind]) >= SHARD_POSITIONS:
            self.flush()

    def positions(self, kind: str | None = None) -> int:
        """Positions written and pending, of one kind or of all."""
        kinds = KINDS if kind is None else (kind,)
        return sum(
            self.state[k]["positions"] + sum(len(s.tokens) for s in self._pending[k])
            for k in kinds
        )

    def spend(self, kind: str, seconds: float) -> None:
        self.state[kind]["seconds"] += seconds

    def rate(self, kind: str) -> float:
        """Positions per second of a kind, as spent (`spend`)."""
        seconds = self.state[kind]["seconds"]
        return self.positions(kind) / seconds if seconds > 0 else 0.0

    def flush(self) -> None:
        for kind, pending in self._pending.items():
            if pending:
                self._write(kind, pending)
                self.state[kind]["positions"] += sum(len(s.tokens) for s in pending)
                pending.clear()
        path = self.folder / "progress.json"
        part = path.with_suffix(".partial")
        part.write_text(json.dumps(self.state))
        part.replace(path)

    def _write(self, kind: str, pending: list[_Seq]) -> None:
        n = len(list(self.folder.glob(f"{kind}-?????")))
        tmp = self.folder / f"{kind}-{n:05d}.partial"
        tmp.mkdir(exist_ok=True)
        cat = {
            "states": [np.concatenate(s.states).astype(np.float16) for s in pending],
            "tokens": [np.asarray(s.tokens, np.int32) for s in pending],
            "label_ids": [np.concatenate(s.label_ids) for s in pending],
            "label_probs": [np.concatenate(s.label_probs) for s in pending],
            "train": [np.concatenate(s.train) for s in pending],
            "top1": [np.concatenate(s.top1).astype(np.int32) for s in pending],
        }
        for name, parts in cat.items():
            np.save(tmp / f"{name}.npy", np.concatenate(parts))
        metas = [{**s.meta, "length": len(s.tokens)} for s in pending]
        (tmp / "meta.json").write_text(json.dumps(metas))
        tmp.replace(self.folder / f"{kind}-{n:05d}")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _top(logits) -> tuple[np.ndarray, np.ndarray]:
    """The top K of the softmax of each row of logits [n, V] (torch): (columns int32 [n, K],
    probabilities float16 [n, K]), most likely first; past V columns, the first again with
    probability 0."""
    import torch

    with torch.inference_mode():
        p, col = torch.topk(torch.softmax(logits, dim=-1), min(K, logits.shape[-1]), dim=-1)
    p, col = p.numpy().astype(np.float16), col.numpy().astype(np.int32)
    if col.shape[1] < K:
        pad = K - col.shape[1]
        col = np.concatenate([col, np.repeat(col[:, :1], pad, axis=1)], axis=1)
        p = np.concatenate([p, np.zeros((len(p), pad), np.float16)], axis=1)
    return col, p


def _labels(final: np.ndarray, rows, ids: np.ndarray):
    """The target's distribution over `ids` from final states [n, d] and their output rows
    `rows` [len(ids), d] (torch, float32): top K (ids, probabilities)."""
    import torch

    logits = torch.from_numpy(np.ascontiguousarray(final, np.float32)) @ rows.T
    col, p = _top(logits)
    return ids[col].astype(np.int32), p


def read(
    target: LM,
    chunks: Iterator,
    writer: Writer,
    until: Callable[[], bool],
    rows: np.ndarray,
    ids: np.ndarray,
    on_sequence: Callable[[int], None] = lambda n: None,
) -> None:
    """Teacher forcing: the target reads `chunks` (`corpus.Chunk`s; those the writer has done
    skipped) one sequence at a time until `until()` says stop, each as [its chat framing] +
    [its text] + [end of turn]; `rows` [len(ids), d] (torch): the output rows of label ids
    `ids`. Positions of the framing are kept (the layer reads them) but not trained on."""
    tok = target.tokenizer
    end = _end_of_turn(target)
    for chunk in chunks:
        if until():
            return
        key = _digest(f"{chunk.document.source}:{chunk.document.name}:{chunk.index}")
        if writer.done("read", key):
            continue
        writer.mark("read", key)
        head = tok.render_chat(chunk.messages())
        body = tok.encode(chunk.text, add_special=False)
        tokens = [*head, *body, end][: target.context_length]
        t = time.perf_counter()
        seq = new_sequence(target)
        try:
            states, final = target.read(seq, tokens)
        finally:
            target.release(seq)
        lab_ids, lab_p = _labels(final, rows, ids)
        train = np.zeros(len(tokens), bool)
        train[len(head) - 1 : len(tokens) - 1] = True  # labels of the answer's tokens
        doc = chunk.document
        meta = {"kind": "read", "source": doc.source, "name": doc.name, "chunk": chunk.index,
                "held_out": chunk.held_out}
        writer.add("read", _Seq(meta, [states], tokens, [lab_ids], [lab_p], [train],
                                [np.full(len(tokens), -1)]))
        writer.spend("read", time.perf_counter() - t)
        on_sequence(len(tokens))


def answer_held_out(i: int) -> bool:
    """Whether the answer to prompt i is held out: 2 of every 40, one greedy, one sampled."""
    return i % 40 in (19, 20)


def _chat(target: LM) -> None:
    """ValueError where the target has no chat template: the data is framed as chat turns."""
    try:
        target.tokenizer.render_chat([{"role": "user", "content": ""}])
    except ValueError:
        raise ValueError(
            f"{Path(target.info.model).name} has no chat template; the training data is framed "
            "as chat turns, as the bench asks: use a chat (instruct) model"
        ) from None


def _end_of_turn(target: LM) -> int:
    """The chat template's end-of-turn token (the end of an answer)."""
    tok = target.tokenizer
    for text in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>"):
        try:
            got = tok.encode(text, add_special=False)
        except ValueError:  # a tokenizer that has no piece for it
            continue
        if len(got) == 1 and got[0] in target.eos_token_ids:
            return got[0]
    return min(target.eos_token_ids)


def answer(
    target: LM,
    prompts: Sequence[str],
    writer: Writer,
    until: Callable[[], bool],
    sequences: int = 8,
    max_tokens: int = 320,
    on_sequence: Callable[[int], None] = lambda n: None,
    about: Sequence[dict] | None = None,
) -> None:
    """Decoding: the target answers `prompts` (those the writer has done skipped, and a prompt's
    repeats), between half of `sequences` and all of them in every forward, until `until()` says
    stop: from then on it starts no answer and finishes those begun (an interrupt drops them;
    their prompts are not asked again). A prompt's answer is greedy for even prompts, at
    temperature 0.7 for odd ones (seeded by its index); its meta is named by that index
    (`answer_held_out` splits by it), or, with `about` (a dict a prompt), is that dict over it
    (`greedy` False draws). A meta's `ended` says whether the answer reached its end of turn
    (else it was cut at `max_tokens`)."""
    tok = target.tokenizer
    todo = [i for i, p in enumerate(prompts) if not writer.done("answer", _digest(p))]
    live: dict[int, dict] = {}

    def finish(seq: int, ended: bool) -> None:
        s = live.pop(seq)
        n = len(s["tokens"])
        states = target.hiddens(seq, 0)
        target.release(seq)
        if states is None or len(states) < n - 1:
            return
        # the last token was emitted, never fed: its state (and its label) do not exist
        tokens = s["tokens"][:-1] if len(states) < n else s["tokens"]
        m = len(tokens)
        lab_ids = np.zeros((m, K), np.int32)
        lab_p = np.zeros((m, K), np.float16)
        top1 = np.full(m, -1)
        first = s["prompt"] - 1  # the prompt's last position predicted the answer's first
        for j, (ids_, p_, t1) in enumerate(s["labels"][: m - first]):
            lab_ids[first + j], lab_p[first + j], top1[first + j] = ids_, p_, t1
        train = np.zeros(m, bool)
        train[first:m] = True
        meta = {**s["meta"], "kind": "answer", "ended": ended}
        writer.add("answer", _Seq(meta, [states[:m]], tokens, [lab_ids], [lab_p], [train], [top1]))
        on_sequence(m)

    def emit(seqs: list[int], rows: np.ndarray) -> None:
        """The next token of each of `seqs` from its logits row [len(seqs), V]: the labels of
        all of them in one batch (torch), then each token drawn."""
        import torch

        ids32, p16 = _top(torch.from_numpy(rows))
        best = rows.argmax(axis=-1)
        for j, seq in enumerate(seqs):
            s = live[seq]
            greedy = s["meta"]["greedy"]
            x = int(best[j]) if greedy else s["sampler"].categorical(warp(rows[j], SAMPLED))
            s["labels"].append((ids32[j], p16[j], int(best[j])))
            s["tokens"].append(x)
            if x in target.eos_token_ids or len(s["tokens"]) - s["prompt"] >= max_tokens:
                finish(seq, x in target.eos_token_ids)

    try:
        while live or (todo and not until()):
            # refill in waves, once half the batch has finished: a finished answer leaves
            # free cells below live ones, which the backend closes (moving every cell above)
            # before its next call, once for the whole wave
            wave = len(live) <= sequences // 2
            while wave and len(live) < sequences and todo and not until():
                i = todo.pop(0)
                if writer.done("answer", _digest(prompts[i])):
                    continue  # asked before in this call: a prompt is answered once
                writer.mark("answer", _digest(prompts[i]))
                seq = new_sequence(target)
                ids = tok.render_chat([{"role": "user", "content": prompts[i]}])
                ids = ids[: target.context_length - max_tokens - 1]
                row = target.forward([(seq, ids)], last_only=True)[0][-1]
                meta = {"source": "answers", "name": f"prompt-{i}",
                        "held_out": answer_held_out(i), "greedy": i % 2 == 0}
                meta.update(about[i] if about is not None else {})
                live[seq] = {"meta": meta, "sampler": Sampler(i), "tokens": list(ids),
                             "prompt": len(ids), "labels": []}
                emit([seq], row[None])
            if live:
                t = time.perf_counter()
                seqs = list(live)
                out = target.forward([(q, [live[q]["tokens"][-1]]) for q in seqs])
                emit(seqs, np.stack([r[-1] for r in out]))
                writer.spend("answer", time.perf_counter() - t)
    finally:
        for q in list(live):
            target.release(q)


def bench_answers(
    target: LM,
    folder: Path,
    max_tokens: int = 256,
    sequences: int = 8,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict:
    """The target's greedy answers to the bench's shipped prompts (their first turn, as the
    bench asks them), written to `folder` as an answer set named by prompt id and category:
    what a layer is scored on as it drafts for the categories (`eagle_training.evaluate`),
    never trained on (it lives apart from `collect`'s folder). Resumes; returns `summary`."""
    from specwise.prompts import shipped

    _chat(target)
    asks = shipped()
    about = [{"source": "bench", "name": p.id, "category": p.category, "held_out": True,
              "greedy": True} for p in asks]
    writer = Writer(folder)
    bar = progress_bar(len(asks), "bench answers", "answer")
    bar.update(len(writer.state["answer"]["done"]))
    try:
        answer(target, [p.turns[0] for p in asks], writer, lambda: False, sequences,
               max_tokens, on_sequence=lambda n: bar.update(1), about=about)
    finally:
        writer.flush()
        bar.close()
    return summary(folder)


def bench_complete(folder: Path) -> bool:
    """Whether `folder` holds the target's answers to every bench prompt (`bench_answers`)."""
    from specwise.prompts import shipped

    path = folder / "progress.json"
    if not path.is_file():
        return False
    asked = set(json.loads(path.read_text()).get("answer", {}).get("done", []))
    return all(_digest(p.turns[0]) in asked for p in shipped())


@contextlib.contextmanager
def interruptible(say: Callable[[str], None]) -> Iterator[Callable[[], bool]]:
    """Ctrl-C (SIGINT) asks the work inside to stop at its next check: yields whether it was
    pressed; a second one raises KeyboardInterrupt. A KeyboardInterrupt raised while the library
    runs a forward is raised in a ctypes callback (the hidden-state tap, the log) and lost
    there, so a flag, read between sequences, is what stops data making cleanly. Outside the
    main thread (where no handler can be set) it yields a check that is never true."""
    pressed: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def on_interrupt(signum, frame) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        say("specwise: stopping after this sequence, its data kept (Ctrl-C again: at once)")

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)


def replies(folder: Path, target: LM, source: str) -> dict[int, str]:
    """The text of every answer of `source` in `folder`'s shards that reached its end of turn,
    by the index its name ends in (`invention-7` is 7)."""
    if not any(folder.glob("answer-?????")):
        return {}
    data = Data(folder, kinds=("answer",))
    out: dict[int, str] = {}
    for m, start, n in zip(data.meta, data.starts, data.lengths, strict=True):
        if m["source"] == source and m.get("ended"):
            end = start + n
            first = start + int(np.argmax(data.train[start:end]))  # the prompt's last position
            ids = [int(t) for t in data.tokens[first + 1 : end] if t not in target.eos_token_ids]
            out[int(m["name"].rsplit("-", 1)[1])] = target.tokenizer.decode(ids)
    return out


def answer_invented(
    target: LM,
    folder: Path,
    writer: Writer,
    count: int,
    until: Callable[[], bool],
    sequences: int = 8,
    on_sequence: Callable[[int], None] = lambda n: None,
    max_tokens: int = 320,
) -> None:
    """Invented asks: the target answers `count` invention prompts (`asks.inventions`; its
    replies are kept as answers of source `invented`), then the asks made of every reply that
    reached its end (`asks.invented_asks`; source `invented-answers`, named by the invention's
    index and the ask's, held out with their invention, so that no subject lies on both sides).
    Both stop when `until()` says so; a resumed run makes the same asks."""
    from specwise import asks, corpus

    made = asks.inventions(count)
    about = [{"source": "invented", "name": f"invention-{i}", "category": kind}
             for i, (kind, _) in enumerate(made)]
    answer(target, [p for _, p in made], writer, until, sequences, max_tokens, on_sequence,
           about)
    writer.flush()
    banned = corpus.bench_shingles()
    kept = [(i, j, ask)
            for i, text in sorted(replies(folder, target, "invented").items()) if i < count
            for j, ask in enumerate(asks.invented_asks(made[i][0], text, i, banned))]
    about = [{"source": "invented-answers", "name": f"invented-{i}-{j}", "category": made[i][0],
              "held_out": answer_held_out(i), "greedy": (i + j) % 2 == 0} for i, j, _ in kept]
    answer(target, [ask for _, _, ask in kept], writer, until, sequences, max_tokens,
           on_sequence, about)


def collect(
    target: LM,
    folder: Path,
    positions: int,
    answers: float = 0.3,
    minutes: float | None = None,
    sequences: int = 8,
    invent: int = 0,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> dict:
    """Make data in `folder` until it holds `positions` positions, `answers` of them answered
    and the rest read, or until `minutes` have passed: a batch of `sequences` prompts answered
    whenever the answers fall behind their share, chunks read otherwise; with `invent`, first
    that many invention prompts and the asks made of them answered (`answer_invented`). Resumes
    where an earlier call stopped (each writer skips what it did). Returns `summary(folder)`."""
    from specwise import asks, corpus
    from specwise.weights import unembedding

    if not target.hidden_layers:
        raise ValueError("making data needs a target built with hidden layers")
    _chat(target)
    if not 0.0 <= answers <= 1.0:
        raise ValueError(f"answers = {answers} is invalid; use a share 0..1")
    import torch

    tok = target.tokenizer
    ids = label_ids(target)
    got = unembedding(target, ids)
    if got is None:
        raise ValueError(f"the output layer of {target.info.model} cannot be read")
    rows = torch.from_numpy(got)
    writer = Writer(folder)
    chunks = corpus.chunks(
        corpus.mix(),
        lambda text: len(tok.encode(text, add_special=False)),
        corpus.bench_shingles(),
    )
    deadline = None if minutes is None else time.monotonic() + minutes * 60.0

    def stop() -> bool:
        late = deadline is not None and time.monotonic() >= deadline
        return late or pressed() or writer.positions() >= positions

    def behind(margin: int = 0) -> bool:  # the answers are short of their share (+ margin)
        return writer.positions("answer") < answers * writer.positions() + margin

    def read_enough() -> bool:
        return stop() or (answers > 0 and behind())

    def answered_enough() -> bool:  # a shard's worth past the share: the batch runs full
        return stop() or not behind(SHARD_POSITIONS)

    bar = progress_bar(positions, "teacher data", initial=min(positions, writer.positions()))

    def moved(n: int) -> None:
        bar.update(max(0, min(positions, writer.positions()) - bar.n))
        rates = {kind: f"{writer.rate(kind):.0f}/s" for kind in KINDS}
        bar.set_postfix(**rates)

    with contextlib.ExitStack() as stack:
        pressed = stack.enter_context(interruptible(progress))
        stack.callback(bar.close)
        stack.callback(writer.flush)
        if invent:
            answer_invented(target, folder, writer, invent, stop, sequences, moved)
        templated = asks.prompts(4000) if answers > 0 and not stop() else []
        while not stop():
            if behind() and answers > 0:
                if all(writer.done("answer", _digest(p)) for p in templated):
                    answers = 0.0  # the asks ran out: read from here on
                    continue
                # the whole list, so that a prompt's index (its name, its split) is its own
                answer(target, templated, writer, answered_enough, sequences, on_sequence=moved)
                continue
            before = writer.positions("read")
            read(target, chunks, writer, read_enough, rows, ids, on_sequence=moved)
            if writer.positions("read") == before and not stop() and not behind():
                if answers in (0.0, 1.0):
                    break  # the corpus ran out
                answers = 1.0
    return summary(folder)


def summary(folder: Path) -> dict:
    """What `folder` holds: positions and seconds per kind (positions/s), positions by source,
    and how many are held out."""
    state = json.loads((folder / "progress.json").read_text()) if (
        folder / "progress.json").exists() else {}
    by_source: dict[str, int] = {}
    held = 0
    for shard in sorted(p for kind in KINDS for p in folder.glob(f"{kind}-?????")):
        for m in json.loads((shard / "meta.json").read_text()):
            by_source[m["source"]] = by_source.get(m["source"], 0) + m["length"]
            held += m["length"] if m.get("held_out") else 0
    kinds = {
        k: {"positions": int(s.get("positions", 0)), "seconds": round(s.get("seconds", 0.0), 1),
            "positions_per_s": round(s["positions"] / s["seconds"], 1) if s.get("seconds") else 0.0}
        for k, s in state.items()
    }
    return {"kinds": kinds, "sources": by_source, "held_out_positions": held}


class Data:
    """Data(folder, kinds=KINDS): the shards of a folder, memory-mapped, as one sequence of
    positions: `states` [n, S] (a lazy concatenation: index it with sorted rows or a slice
    within a sequence), `tokens`, `label_ids`, `label_probs`, `train`, `top1` [n], and the
    sequences (`starts`, `lengths`, `meta`)."""

    def __init__(self, folder: Path, kinds: Sequence[str] = KINDS) -> None:
        shards = sorted(p for k in kinds for p in folder.glob(f"{k}-?????") if p.is_dir())
        if not shards:
            raise ValueError(f"{folder} holds no data yet; make some with `specwise heads data`")
        self._states = [np.load(p / "states.npy", mmap_mode="r") for p in shards]
        def load(name: str) -> np.ndarray:
            return np.concatenate([np.load(p / f"{name}.npy") for p in shards])

        self.tokens = load("tokens").astype(np.int64)
        self.label_ids = load("label_ids")
        self.label_probs = load("label_probs")
        self.train = load("train")
        self.top1 = load("top1")
        self.meta = [m for p in shards for m in json.loads((p / "meta.json").read_text())]
        self.lengths = np.array([m["length"] for m in self.meta], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self._shard_start = np.concatenate([[0], np.cumsum([len(s) for s in self._states])])
        self.state_size = self._states[0].shape[1]

    def __len__(self) -> int:
        return len(self.tokens)

    def states(self, start: int, end: int) -> np.ndarray:
        """The states of positions start..end-1 [end - start, S] float16 (within one shard:
        a sequence never spans two)."""
        k = int(np.searchsorted(self._shard_start, start, side="right")) - 1
        base = self._shard_start[k]
        return np.asarray(self._states[k][start - base : end - base])

    def held_out(self) -> np.ndarray:
        """[sequences] bool: held out (never trained on): a read document by its name
        (`corpus.held_out`), an answer by its prompt's index (`answer_held_out`), as written."""
        return np.array([bool(m["held_out"]) for m in self.meta])


def progress_bar(total: int, desc: str, unit: str = "pos", initial: int = 0):
    """A progress bar on stderr; `initial` is done already (a resumed run: its rate and ETA
    count what this run does)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, smoothing=0.05,
                initial=initial)
