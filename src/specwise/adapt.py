"""`Adapter`: drafting heads that keep learning from the traffic a server serves (online
speculative decoding, OSD: Liu et al., arXiv 2310.07177), for `specwise serve --adapt`.

What it learns from. The engine shows it every round of every request (`observe`): the
target's final hidden state h_p at the request's last cached position p, the state whose
logits gave the token at p+1. When the request ends (`finish`) each kept state becomes one
example whose labels are the tokens the target emitted at p+2 .. p+1+H (head i's answer, as
an index into the heads' vocabulary; -1 where the token is outside it or past the end).
Under greedy decoding these are the target's argmaxes; sampled, they are draws from the
target, whose cross-entropy has the expectation (and the gradient) of the soft one that
`distill` trains with. A failed or cancelled request teaches nothing. Examples go to a
bounded replay buffer (`Replay`: the newest `capacity`).

How. One background thread, with one torch thread, never the scheduler's: AdamW steps on
`batch` examples drawn from a buffer, each step followed by a sleep that keeps the thread's
CPU time within `budget` of one core. It trains while a buffer's examples have been drawn
fewer than `passes` times on average, so without traffic it does no work. Every `swap_every`
steps, and when it runs out of work, the new weights go to the heads the drafter reads
(`Heads.publish`: one reference assignment, so a round drafts with the old weights or the
new, never a mix). A training error is logged and stops the adaptation; serving goes on with
the heads as they were.

Whose heads. Scope "global": one adapted copy for every request. "key": one per tenant (the
server's hash of an API key; requests without a key are one tenant), each grown from the
trained heads, so no tenant's drafts are shaped by another's text; at most `tenants` copies
live, the least recently used dropped (that tenant starts again from the trained heads). The
trained heads and their file are never changed.

Across restarts (`serve --adapt-cache PATH`): `save` writes every adapted copy's weights, by
tenant, to one file; `load` takes them back, but only for the same trained heads and scope (a
copy adapted from other heads, or kept for another scope, is left out with a log line). The
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

from specwise.drafters.heads import Heads
from specwise.request import Request

__all__ = ["SCOPES", "Adapter", "Replay"]

log = logging.getLogger(__name__)
SCOPES = ("key", "global")
FORMAT = 1  # the layout of `Adapter.save`'s file


class Replay:
    """Replay(capacity, hidden_size, n_heads): the newest `capacity` examples, hidden states
    (float16) and labels [n_heads] (-1: none)."""

    def __init__(self, capacity: int, hidden_size: int, n_heads: int) -> None:
        self.hidden = np.zeros((capacity, hidden_size), dtype=np.float16)
        self.labels = np.full((capacity, n_heads), -1, dtype=np.int32)
        self.size = 0  # examples held
        self.added = 0  # examples ever added
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


class _Tenant:
    """One adapted copy: its examples, and (made by the training thread at its first step)
    its heads and optimizer."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.heads: Heads | None = None
        self.opt: Any = None
        self.drawn = 0  # examples drawn for training
        self.steps = 0
        self.unpublished = 0  # steps since the drafter's copy was last swapped


class Adapter:
    """Adapter(heads, scope="global", budget=0.1, ...): adapts copies of trained `heads` to the
    requests an engine serves (module docstring). Give it to the engine as its `learner` and
    to the heads drafter as its `adapter`; `start` the training thread, `close` it at the end.
    Building one starts no thread and copies no weights."""

    def __init__(
        self,
        heads: Heads,
        scope: str = "global",
        budget: float = 0.1,
        capacity: int = 8192,
        batch: int = 128,
        lr: float = 1e-3,
        passes: float = 4.0,
        swap_every: int = 8,
        tenants: int = 4,
        seed: int = 0,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"the adaptation scope {scope!r} is invalid; use one of {SCOPES}")
        if not 0 < budget <= 1:
            raise ValueError(f"an adaptation budget of {budget:g} is invalid; use 0 < budget <= 1")
        for name, value in (("capacity", capacity), ("batch", batch), ("tenants", tenants)):
            if value < 1:
                raise ValueError(f"an adaptation {name} of {value} is invalid; use >= 1")
        if swap_every < 1 or not lr > 0 or not passes > 0:
            raise ValueError("swap_every must be >= 1, lr and passes > 0")
        self.base = heads
        self.scope, self.budget, self.capacity, self.batch = scope, budget, capacity, batch
        self.lr, self.passes, self.swap_every, self.max_tenants = lr, passes, swap_every, tenants
        self.seed = seed
        where = np.full(heads.vocab_size, -1, dtype=np.int32)
        where[heads.ids] = np.arange(len(heads.ids), dtype=np.int32)
        self._where = where  # target id -> index in the heads' vocabulary, or -1
        self._tenants: collections.OrderedDict[str | None, _Tenant] = collections.OrderedDict()
        self._seqs: dict[int, str | None] = {}  # live sequence -> its tenant's key
        self._states: dict[int, dict[int, np.ndarray]] = {}  # sequence -> position -> state
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._go = threading.Event()  # cleared: paused
        self._go.set()
        self._thread: threading.Thread | None = None
        self.steps = self.swaps = self.examples = 0  # totals, for /metrics
        self.loss: float | None = None  # moving average of the training loss
        self.error: str | None = None

    # -- the engine's side (the scheduler thread) ----------------------------------------------
    def observe(self, req: Request, position: int, hidden: np.ndarray | None) -> None:
        """After a round of `req`: the target's hidden state at its cache's last position."""
        with self._lock:
            if req.seq not in self._seqs:
                self._seqs[req.seq] = None if self.scope == "global" else req.tenant
            if hidden is not None:
                self._states.setdefault(req.seq, {})[position] = np.asarray(hidden, np.float16)

    def finish(self, req: Request) -> None:
        """`req` ended: its states become examples (if it ended well) in its tenant's buffer."""
        with self._lock:
            states = self._states.pop(req.seq, {})
            key = self._seqs.pop(req.seq, None)
        if req.finish_reason not in ("stop", "length") or not states:
            return
        ctx = np.asarray(req.context)
        n_heads = self.base.n_heads
        pos = np.fromiter(states, dtype=np.int64)
        labels = np.full((len(pos), n_heads), -1, dtype=np.int32)
        for i in range(1, n_heads + 1):
            at = pos + 1 + i
            ok = at < len(ctx)
            labels[ok, i - 1] = self._where[ctx[at[ok]]]
        useful = (labels >= 0).any(axis=1)
        if not useful.any():
            return
        hidden = np.stack(list(states.values()))[useful]
        with self._lock:
            tenant = self._tenants.get(key)
            if tenant is None:
                replay = Replay(self.capacity, self.base.hidden_size, n_heads)
                tenant = self._tenants[key] = _Tenant(replay)
                while len(self._tenants) > self.max_tenants:
                    self._tenants.popitem(last=False)
            self._tenants.move_to_end(key)
            tenant.replay.add(hidden, labels[useful])
            self.examples += int(useful.sum())
        self._wake.set()

    # -- the drafter's side ------------------------------------------------------------------
    def heads_for(self, seq: int) -> Heads:
        """The heads to draft with for sequence `seq`: its tenant's adapted copy, or the
        trained heads while it has none."""
        key = self._seqs.get(seq)
        tenant = self._tenants.get(key)
        heads = None if tenant is None else tenant.heads
        return self.base if heads is None else heads

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
        if self._thread is not None:
            self._thread.join(timeout)

    def pause(self) -> None:
        """Hold the training thread after its step in progress (a benchmark charges its CPU
        time to the engine that adapts, and to no other)."""
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            held = sum(t.replay.size for t in self._tenants.values())
            tenants = len(self._tenants)
        return {
            "steps": self.steps,
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
            tenant = self._due()
            if tenant is None:
                self._publish()
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            cpu = time.thread_time()
            try:
                self.step(tenant, rng)
            except Exception as exc:  # never into the server: stop adapting, keep serving
                log.exception("adapting the heads failed; serving goes on without adapting")
                self.error = f"{type(exc).__name__}: {exc}"
                return
            busy = time.thread_time() - cpu
            self._stop.wait(busy * (1.0 / self.budget - 1.0))

    def step(self, tenant: _Tenant, rng: np.random.Generator) -> None:
        """One training step for `tenant` (the training thread's; tests call it directly)."""
        import torch

        from specwise.distill import soft_loss

        if tenant.heads is None:
            tenant.heads = copy.deepcopy(self.base)
        if tenant.opt is None:
            tenant.opt = torch.optim.AdamW(
                tenant.heads.module.parameters(), lr=self.lr, weight_decay=0.0
            )
        with self._lock:
            hidden, labels = tenant.replay.sample(self.batch, rng)
        target = torch.zeros(len(labels), self.base.n_heads, len(self.base.ids))
        rows, heads = np.nonzero(labels >= 0)
        target[rows, heads, labels[rows, heads]] = 1.0
        loss = soft_loss(tenant.heads.module(torch.from_numpy(hidden).float()), target)
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
        tenant.drawn += len(labels)  # last: `busy` stays true until the step is done

    # -- across restarts ----------------------------------------------------------------------
    def save(self, path: str | Path) -> int:
        """Write every tenant's adapted weights to `path` (atomically); the copies written. Call
        with the training thread closed."""
        import torch

        with self._lock:
            copies = [
                {"tenant": key, "weights": t.heads.module.state_dict(), "steps": t.steps}
                for key, t in self._tenants.items()
                if t.heads is not None
            ]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        state = {"format": FORMAT, "heads": self._identity(), "scope": self.scope}
        torch.save({**state, "copies": copies}, tmp)
        tmp.replace(path)
        return len(copies)

    def load(self, path: str | Path) -> int:
        """Take back the copies `save` wrote to `path` for these trained heads and this scope
        (none where there is no file); the copies taken. ValueError naming the file where it
        holds none specwise can read."""
        import torch

        path = Path(path)
        if not path.exists():
            return 0
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            ok = state["format"] == FORMAT and state["heads"] == self._identity()
            ok = ok and state["scope"] == self.scope
            copies = state["copies"] if ok else []
            tenants = []
            for c in copies[-self.max_tenants :]:
                heads = copy.deepcopy(self.base)
                heads.module.load_state_dict(c["weights"])
                heads.publish()
                tenant = _Tenant(Replay(self.capacity, self.base.hidden_size, self.base.n_heads))
                tenant.heads, tenant.steps = heads, int(c["steps"])
                tenants.append((c["tenant"], tenant))
        except Exception as exc:  # any unreadable file: one clear error
            raise ValueError(f"{path} holds no adapted heads specwise can read ({exc})") from None
        if not ok:
            log.warning(
                "%s holds heads adapted from other trained heads or for another scope; "
                "starting from the trained heads",
                path,
            )
        with self._lock:
            for key, tenant in tenants:
                self._tenants[key] = tenant
        return len(tenants)

    def _identity(self) -> str:
        """Which trained heads the copies grew from."""
        meta = self.base.meta
        return f"{meta.get('key', 'unsaved')}:{meta.get('trained', '')}:{len(self.base.ids)}"

    def _publish(self) -> None:
        """Swap in every tenant's steps not yet published (the thread ran out of work)."""
        with self._lock:
            waiting = [t for t in self._tenants.values() if t.unpublished]
        for t in waiting:
            self._swap(t)

    def _swap(self, tenant: _Tenant) -> None:
        assert tenant.heads is not None
        tenant.heads.publish()
        tenant.unpublished = 0
        self.swaps += 1
