"""`Adapter`: a drafter on the target's hidden states that keeps learning from the traffic a
server serves (online speculative decoding, OSD: Liu et al., arXiv 2310.07177), for
`specwise serve --adapt`: the Medusa heads (`drafters.heads`) or the eagle drafter's layer
(`drafters.eagle`).

What it learns from. The engine shows it the target after every round of every request
(`observe`), and it keeps the hidden state h_p (the heads': the final one; the layer's: the
outputs of the layers it reads) of every position p of the answer, the
state whose logits gave the token at p+1 (from the prompt's last position on: what a backend
keeps of a sequence, `LM.hiddens`), as `distill` records for training. When the request ends
(`finish`), for the heads each state becomes one example whose labels are the tokens the target
emitted at p+2 .. p+1+H (head i's answer, as an index into the heads' vocabulary; -1 where the
token is outside it or past the end); for the layer the answer becomes one example: the
states, the token that followed each, and the token after that as its label (the layer reads
the whole answer, `eagle_training`; at its first draft depth only).
Under greedy decoding the labels are the target's argmaxes; sampled, they are draws from the
target, whose cross-entropy has the expectation (and the gradient) of the soft one that
`distill` trains with. A failed or cancelled request teaches nothing. Examples go to a
bounded replay buffer (`Replay`: the newest `capacity` positions; `Answers`: the newest
answers holding at most `capacity` positions).

How. One background thread, with one torch thread, never the scheduler's: AdamW steps (at
`lr`, by default the rate `distill` trained the network at) on `batch` positions drawn from a buffer (for the layer: whole answers, until they hold `batch`
positions), each step followed by a rest that keeps the thread's CPU time within a share of
one core: `idle_budget` while no request is in the engine (from `begin` to `finish`), `budget`
while one is (0: no step then); a request admitted during a step shares the CPU with the rest
of that step only. Training while the target decodes is dear on a CPU: the target's forward
spreads over every core, so a core the thread takes stalls the forward more than its share;
the idle time between a user's requests costs nothing to use. It trains while a buffer's
positions have been drawn fewer than `passes` times on average, so without traffic it does no
work. Every `swap_every` steps, and when it runs out
of work, the new weights go to the network the drafter reads (`publish`: one reference
assignment, so a round drafts with the old weights or the new, never a mix; the layer keeps
the weights a request began with to its end, since its cache was filled by them). A training
error is logged and stops the adaptation; serving goes on with the network as it was.

Whose network. Scope "global": one adapted copy for every request. "key": one per tenant (the
server's hash of an API key; requests without a key are one tenant), each grown from the
trained network, so no tenant's drafts are shaped by another's text; at most `tenants` copies
live, the least recently used dropped (that tenant starts again from the trained network). The
trained network and its file are never changed.

Across restarts (`serve --adapt-cache PATH`): `save` writes every adapted copy's weights, by
tenant, to one file; `load` takes them back, but only for the same trained network and scope
(a copy adapted from another, or kept for another scope, is left out with a log line). The
replay buffers and the optimizer's state are not kept: a restored copy goes on learning from
new traffic.
"""

from __future__ import annotations

import collections
import copy
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from specwise.backends.base import LM
from specwise.distill import HEADS_LR
from specwise.drafters.eagle import COPY_N, Layer
from specwise.drafters.heads import Heads, vocab_index
from specwise.drafters.ngram import continuations
from specwise.eagle_training import FINAL_LR
from specwise.request import Request

__all__ = ["SCOPES", "Adapter", "Answers", "Replay"]

log = logging.getLogger(__name__)
SCOPES = ("key", "global")
FORMAT = 1  # the layout of `Adapter.save`'s file


class Replay:
    """Replay(capacity, hidden_size, n_heads): the heads' examples, the newest `capacity`:
    hidden states (float16) and labels [n_heads] (-1: none)."""

    def __init__(self, capacity: int, hidden_size: int, n_heads: int) -> None:
        self.hidden = np.zeros((capacity, hidden_size), dtype=np.float16)
        self.labels = np.full((capacity, n_heads), -1, dtype=np.int32)
        self.size = 0  # positions held
        self.added = 0  # positions ever added
        self._next = 0

    def add(self, hidden: np.ndarray, labels: np.ndarray) -> None:
        cap = len(self.labels)
        for h, lab in zip(hidden[-cap:], labels[-cap:], strict=True):
            self.hidden[self._next], self.labels[self._next] = h, lab
            self._next = (self._next + 1) % cap
        self.size = min(cap, self.size + len(labels))
        self.added += len(labels)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n examples drawn uniformly with replacement (copies)."""
        rows = rng.integers(0, self.size, size=n)
        return self.hidden[rows], self.labels[rows]


class Answers:
    """Answers(capacity): the layer's examples, whole answers, the newest holding at most
    `capacity` positions in all: states [n, d] (float16), the token index that followed each
    [n], that token's copy (index and match length, [n] each) and the label after it [n] (-1:
    none)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: collections.deque[tuple[np.ndarray, ...]] = collections.deque()
        self.size = 0  # positions held
        self.added = 0  # positions ever added

    def add(self, *arrays: np.ndarray) -> None:
        """One answer: its arrays (states, tokens, copies, match lengths, labels), all [n, ...]."""
        keep = slice(-self.capacity, None)  # an answer longer than the buffer: its end
        self.items.append(tuple(x[keep] for x in arrays))
        self.size += len(self.items[-1][-1])
        self.added += len(arrays[-1])
        while self.size > self.capacity:
            self.size -= len(self.items.popleft()[-1])

    def sample(self, n: int, rng: np.random.Generator) -> list[tuple]:
        """Answers drawn uniformly with replacement until they hold n positions (at least one
        answer)."""
        got: list[tuple] = []
        held = 0
        while held < n or not got:
            got.append(self.items[int(rng.integers(0, len(self.items)))])
            held += len(got[-1][-1])
        return got


class _Work:
    """What one kind of network learns from (a subclass per kind): `observe` keeps states,
    `example` makes a finished request's example, `draw` and `loss` train on them."""

    name = ""
    lr = 0.0  # AdamW's rate

    def __init__(self, net: Any) -> None:
        self.net = net
        self.where = vocab_index(net.ids, net.vocab_size)  # target id -> index, or -1

    def observe(self, states: dict[int, np.ndarray], target: LM, seq: int) -> None:
        """Keep the states of `seq`'s positions the target added since the last call."""
        read = max(states) + 1 if states else 0
        rows = target.hiddens(seq, read)
        if rows is None:
            return
        first = target.length(seq) - len(rows)
        for i, row in enumerate(rows):
            states[first + i] = np.asarray(row, np.float16)

    @staticmethod
    def answer(states: dict[int, np.ndarray], ctx: np.ndarray) -> np.ndarray:
        """The positions of the answer's kept states: their last run of consecutive positions,
        each followed by a token in `ctx`."""
        pos = np.array(sorted(states), dtype=np.int64)
        gaps = np.flatnonzero(np.diff(pos) != 1)
        pos = pos[gaps[-1] + 1 if len(gaps) else 0 :]
        return pos[pos + 1 < len(ctx)]


class _HeadsWork(_Work):
    """What the heads learn from: every state of an answer, labelled with the H tokens after
    the one it predicted (module docstring)."""

    name = "heads"
    lr = HEADS_LR  # the rate it was trained at

    def replay(self, capacity: int) -> Replay:
        return Replay(capacity, self.net.hidden_size, self.net.n_heads)

    def example(self, states: dict[int, np.ndarray], ctx: np.ndarray) -> tuple | None:
        """(hidden [n, d], labels [n, H]) of a finished request's answer, or None."""
        n_heads = self.net.n_heads
        pos = self.answer(states, ctx)
        labels = np.full((len(pos), n_heads), -1, dtype=np.int32)
        for i in range(1, n_heads + 1):
            at = pos + 1 + i
            ok = at < len(ctx)
            labels[ok, i - 1] = self.where[ctx[at[ok]]]
        useful = (labels >= 0).any(axis=1)
        if not useful.any():
            return None
        return np.stack([states[int(p)] for p in pos[useful]]), labels[useful]

    def draw(self, replay: Replay, batch: int, rng: np.random.Generator):
        """(`batch` examples drawn from `replay`, copies; the positions drawn)."""
        drawn = replay.sample(batch, rng)
        return drawn, len(drawn[1])

    def loss(self, net: Heads, drawn):
        import torch

        from specwise.distill import soft_loss

        hidden, labels = drawn
        target = torch.zeros(len(labels), net.n_heads, len(net.ids))
        rows, heads = np.nonzero(labels >= 0)
        target[rows, heads, labels[rows, heads]] = 1.0
        return soft_loss(net.module(torch.from_numpy(hidden).float()), target)


class _LayerWork(_Work):
    """What the eagle drafter's layer learns from: every position of an answer, with the token
    that followed it and the one after that as its label (module docstring)."""

    name = "eagle"
    lr = FINAL_LR  # the rate its training ended at

    def replay(self, capacity: int) -> Answers:
        return Answers(capacity)

    def example(self, states: dict[int, np.ndarray], ctx: np.ndarray) -> tuple | None:
        """(states [n, d], token indices [n], their copies' indices and match lengths [n] each,
        labels [n]) of a finished request's answer, or None."""
        pos = self.answer(states, ctx)
        if len(pos) == 0:
            return None
        nxt = np.full(len(pos), -1, dtype=np.int64)
        ok = pos + 2 < len(ctx)
        nxt[ok] = ctx[pos[ok] + 2]
        ids, sizes = continuations(ctx[: int(pos[-1]) + 2].tolist(), COPY_N)
        ids, sizes = ids[pos + 1], sizes[pos + 1]
        labels = self.net.columns(nxt, ids, sizes).astype(np.int32)
        if not (labels >= 0).any():
            return None
        hidden = np.stack([states[int(p)] for p in pos])
        return hidden, self.net.index(ctx[pos + 1]), self.net.index(ids), sizes, labels

    def draw(self, answers: Answers, batch: int, rng: np.random.Generator):
        """(answers drawn from `answers` until they hold `batch` positions; the positions)."""
        drawn = answers.sample(batch, rng)
        return drawn, sum(len(a[-1]) for a in drawn)

    def loss(self, net: Layer, drawn):
        import torch

        width = max(len(a[-1]) for a in drawn)
        h = torch.zeros(len(drawn), width, net.state_size)
        t = torch.full((len(drawn), width), len(net.ids), dtype=torch.long)
        c = torch.full_like(t, len(net.ids))
        size = torch.zeros_like(t)
        y = torch.full((len(drawn), width), -1, dtype=torch.long)
        for b, (hidden, tokens, copied, sizes, labels) in enumerate(drawn):
            n = len(labels)
            h[b, :n] = torch.from_numpy(hidden.astype(np.float32))
            t[b, :n] = torch.from_numpy(tokens)
            c[b, :n] = torch.from_numpy(copied)
            size[b, :n] = torch.from_numpy(sizes.astype(np.int64))
            y[b, :n] = torch.from_numpy(labels.astype(np.int64))
        logits = net.module(h, t, c, size)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1)


class _Tenant:
    """One adapted copy: its examples, and (made by the training thread at its first step)
    its network and optimizer."""

    def __init__(self, replay: Replay | Answers) -> None:
        self.replay = replay
        self.net: Any = None
        self.opt: Any = None
        self.drawn = 0  # positions drawn for training
        self.steps = 0
        self.unpublished = 0  # steps since the drafter's copy was last swapped


class Adapter:
    """Adapter(net, scope="global", budget=0.1, idle_budget=1.0, ...): adapts copies of a
    trained network, the `Heads` or an eagle `Layer`, to the requests an engine serves (module
    docstring). Give it to the engine as its `learner` and to the drafter as its `adapter`;
    `start` the training thread, `close` it at the end. Building one starts no thread and
    copies no weights."""

    def __init__(
        self,
        net: Heads | Layer,
        scope: str = "global",
        budget: float = 0.1,
        idle_budget: float = 1.0,
        capacity: int = 8192,
        batch: int = 128,
        lr: float | None = None,
        passes: float = 4.0,
        swap_every: int = 8,
        tenants: int = 4,
        seed: int = 0,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"the adaptation scope {scope!r} is invalid; use one of {SCOPES}")
        if not 0 <= budget <= 1:
            raise ValueError(
                f"an adaptation budget of {budget:g} is invalid; use a share of one core, "
                "0 <= budget <= 1 (0: train only while no request is in)"
            )
        if not 0 < idle_budget <= 1:
            raise ValueError(
                f"an idle adaptation budget of {idle_budget:g} is invalid; use a share of one "
                "core, 0 < budget <= 1"
            )
        for name, value in (("capacity", capacity), ("batch", batch), ("tenants", tenants)):
            if value < 1:
                raise ValueError(f"an adaptation {name} of {value} is invalid; use >= 1")
        if swap_every < 1 or not (lr is None or lr > 0) or not passes > 0:
            raise ValueError("swap_every must be >= 1, lr and passes > 0")
        self.base = net
        self._work: _Work = _LayerWork(net) if isinstance(net, Layer) else _HeadsWork(net)
        self.scope, self.budget, self.capacity, self.batch = scope, budget, capacity, batch
        self.idle_budget = idle_budget
        self.lr = self._work.lr if lr is None else lr
        self.passes, self.swap_every, self.max_tenants = passes, swap_every, tenants
        self.seed = seed
        self._tenants: collections.OrderedDict[str | None, _Tenant] = collections.OrderedDict()
        self._seqs: dict[int, str | None] = {}  # live sequence -> its tenant's key
        self._live: set[int] = set()  # sequences begun and not finished
        self._states: dict[int, dict[int, np.ndarray]] = {}  # sequence -> position -> state
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._go = threading.Event()  # cleared: paused
        self._go.set()
        self._idle = threading.Event()  # set: no request in the engine
        self._idle.set()
        self._stepping = threading.Lock()  # held by the thread during a step
        self._thread: threading.Thread | None = None
        self.steps = self.swaps = self.examples = 0  # totals, for /metrics
        self.idle_steps = 0  # of `steps`, those taken while no request was in
        self.loss: float | None = None  # moving average of the training loss
        self.error: str | None = None

    @property
    def kind(self) -> str:
        """The drafter whose network it adapts: "heads" or "eagle"."""
        return self._work.name

    # -- the engine's side (the scheduler thread) ----------------------------------------------
    def begin(self, req: Request) -> None:
        """`req` was admitted: the engine is no longer idle until every request has finished."""
        with self._lock:
            self._live.add(req.seq)
            self._idle.clear()

    def observe(self, req: Request, target: LM) -> None:
        """After a round of `req`: keep the target's states it learns from."""
        with self._lock:
            if req.seq not in self._live:  # a caller that skipped `begin`
                self._live.add(req.seq)
                self._idle.clear()
            if req.seq not in self._seqs:
                self._seqs[req.seq] = None if self.scope == "global" else req.tenant
            self._work.observe(self._states.setdefault(req.seq, {}), target, req.seq)

    def finish(self, req: Request) -> None:
        """`req` ended: its states become examples (if it ended well) in its tenant's buffer."""
        with self._lock:
            states = self._states.pop(req.seq, {})
            key = self._seqs.pop(req.seq, None)
            self._live.discard(req.seq)
            if not self._live:
                self._idle.set()
        if req.finish_reason not in ("stop", "length") or not states:
            return
        example = self._work.example(states, np.asarray(req.context))
        if example is None:
            return
        with self._lock:
            tenant = self._tenants.get(key)
            if tenant is None:
                tenant = self._tenants[key] = _Tenant(self._work.replay(self.capacity))
                while len(self._tenants) > self.max_tenants:
                    self._tenants.popitem(last=False)
            self._tenants.move_to_end(key)
            tenant.replay.add(*example)
            labels = example[-1]  # [n, H] or [n]: a position with any label is learnt from
            self.examples += int((labels >= 0).reshape(len(labels), -1).any(axis=1).sum())
        self._wake.set()

    # -- the drafter's side ------------------------------------------------------------------
    def net_for(self, seq: int) -> Any:
        """The network to draft with for sequence `seq`: its tenant's adapted copy, or the
        trained one while it has none."""
        key = self._seqs.get(seq)
        tenant = self._tenants.get(key)
        net = None if tenant is None else tenant.net
        return self.base if net is None else net

    # -- the training thread -----------------------------------------------------------------
    def start(self) -> None:
        """Start the training thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specwise-adapt", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the training thread (its step in progress finishes first)."""
        self._stop.set()
        self._wake.set()
        self._go.set()
        self._idle.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def pause(self) -> None:
        """Hold the training thread; returns once its step in progress, if any, has ended (a
        benchmark charges its CPU time to the engine that adapts, and to no other)."""
        self._go.clear()
        with self._stepping:
            pass

    def resume(self) -> None:
        self._go.set()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            held = sum(t.replay.size for t in self._tenants.values())
            tenants = len(self._tenants)
        return {
            "steps": self.steps,
            "idle_steps": self.idle_steps,
            "swaps": self.swaps,
            "examples": self.examples,
            "held": held,
            "tenants": tenants,
            "loss": self.loss,
            "error": self.error,
        }

    def busy(self) -> bool:
        """True while examples wait to be learnt from or steps to be swapped in."""
        with self._lock:
            return any(self._owed(t) or t.unpublished for t in self._tenants.values())

    def _owed(self, t: _Tenant) -> bool:
        return bool(t.replay.size) and t.drawn < self.passes * t.replay.added

    def _due(self) -> _Tenant | None:
        """The least recently served tenant with examples left to learn from, if any."""
        with self._lock:
            for t in self._tenants.values():
                if self._owed(t):
                    return t
        return None

    def _run(self) -> None:
        import torch

        torch.set_num_threads(1)  # this thread's products on one core (a per-thread setting)
        rng = np.random.default_rng(self.seed)
        while not self._stop.is_set():
            self._go.wait()
            if self.budget == 0:
                self._idle.wait()  # no step while a request is in
            tenant = self._due()
            if tenant is None:
                self._publish()
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            with self._stepping:
                idle = self._idle.is_set()
                if not self._go.is_set() or not (idle or self.budget):  # paused, or a request
                    continue  # came in since the waits above
                cpu = time.thread_time()
                try:
                    self.step(tenant, rng)
                except Exception as exc:  # never into the server: stop adapting, keep serving
                    log.exception("adapting the drafter failed; serving goes on without adapting")
                    self.error = f"{type(exc).__name__}: {exc}"
                    return
                busy = time.thread_time() - cpu
                self.idle_steps += idle
            rest = busy * (1.0 / (self.idle_budget if idle else self.budget) - 1.0)
            (self._stop if idle else self._idle).wait(rest)  # going idle ends a rest early

    def step(self, tenant: _Tenant, rng: np.random.Generator) -> None:
        """One training step for `tenant` (the training thread's; tests call it directly)."""
        import torch

        if tenant.net is None:
            tenant.net = copy.deepcopy(self.base)
        if tenant.opt is None:
            tenant.opt = torch.optim.AdamW(
                tenant.net.module.parameters(), lr=self.lr, weight_decay=0.0
            )
        with self._lock:  # copies, or arrays nothing writes again
            drawn, positions = self._work.draw(tenant.replay, self.batch, rng)
        loss = self._work.loss(tenant.net, drawn)
        if loss is not None:  # every example drawn has a label (`finish`), but be safe
            tenant.opt.zero_grad()
            loss.backward()
            tenant.opt.step()
            value = float(loss.detach())
            self.loss = value if self.loss is None else 0.95 * self.loss + 0.05 * value
            tenant.steps += 1
            tenant.unpublished += 1
            self.steps += 1
            if tenant.unpublished >= self.swap_every:
                self._swap(tenant)
        tenant.drawn += positions  # last: `busy` stays true until the step is done

    # -- across restarts ----------------------------------------------------------------------
    def save(self, path: str | Path) -> int:
        """Write every tenant's adapted weights to `path` (atomically); the copies written. Call
        with the training thread closed."""
        import torch

        with self._lock:
            copies = [
                {"tenant": key, "weights": t.net.module.state_dict(), "steps": t.steps}
                for key, t in self._tenants.items()
                if t.net is not None
            ]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        state = {"format": FORMAT, "kind": self.kind, "heads": self._identity()}
        state["scope"] = self.scope
        torch.save({**state, "copies": copies}, tmp)
        tmp.replace(path)
        return len(copies)

    def load(self, path: str | Path) -> int:
        """Take back the copies `save` wrote to `path` for this trained network and this scope
        (none where there is no file); the copies taken. ValueError naming the file where it
        holds none specwise can read."""
        import torch

        path = Path(path)
        if not path.exists():
            return 0
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            ok = state["format"] == FORMAT and state["heads"] == self._identity()
            ok = ok and state.get("kind", "heads") == self.kind and state["scope"] == self.scope
            copies = state["copies"] if ok else []
            tenants = []
            for c in copies[-self.max_tenants :]:
                net = copy.deepcopy(self.base)
                net.module.load_state_dict(c["weights"])
                net.publish()
                tenant = _Tenant(self._work.replay(self.capacity))
                tenant.net, tenant.steps = net, int(c["steps"])
                tenants.append((c["tenant"], tenant))
        except Exception as exc:  # any unreadable file: one clear error
            raise ValueError(f"{path} holds no adapted drafter specwise can read ({exc})") from None
        if not ok:
            log.warning(
                "%s holds a drafter adapted from another trained one or for another scope; "
                "starting from the trained %s",
                path,
                self.kind,
            )
        with self._lock:
            for key, tenant in tenants:
                self._tenants[key] = tenant
        return len(tenants)

    def _identity(self) -> str:
        """Which trained network the copies grew from."""
        meta = self.base.meta
        return f"{meta.get('key', 'unsaved')}:{meta.get('trained', '')}:{len(self.base.ids)}"

    def _publish(self) -> None:
        """Swap in every tenant's steps not yet published (the thread ran out of work)."""
        with self._lock:
            waiting = [t for t in self._tenants.values() if t.unpublished]
        for t in waiting:
            self._swap(t)

    def _swap(self, tenant: _Tenant) -> None:
        assert tenant.net is not None
        tenant.net.publish()
        tenant.unpublished = 0
        self.swaps += 1
