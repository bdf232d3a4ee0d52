"""`SuffixDrafter`: drafts what followed the context's longest earlier suffix, in this request
and in earlier requests (SuffixDecoding's idea: home users repeat themselves).

Each round looks the context's suffix (up to MAX_MATCH tokens) up in the request's own tokens
(`LiveIndex`) and in the memory of earlier requests (`SuffixIndex`: their prompts and outputs),
takes the longest match and proposes the continuations of its occurrences, with each token's
share of them as its confidence (a score the controller calibrates): as a tree, grown best first
(up to `branches` children a token), where the target takes trees in one call (`LM.trees`),
else the most frequent continuation as a chain. Drafts are point masses (`probs=None`), so any
acceptance rule stays exact. `suffix-chain` is the same drafter drafting chains only (to
measure what the trees add).

Scope of the memory (`scope`): "request" keeps none; "key" keeps one per tenant (the server's
API key: one tenant never gets drafts built from another's text); "global" one for all. The
memory stays within `budget_mib` (least recently used segments go first) and lives in this
object; `save` and `load` move it to and from a file when the caller asks. No disk is touched
otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specwise.backends.base import LM
from specwise.drafters.base import Draft, KeepGoing, measure_cheap, register
from specwise.drafters.suffix_index import MAX_MATCH, LiveIndex, SuffixIndex, tree
from specwise.sampling import Sampler, SamplingParams

__all__ = ["SCOPES", "SuffixDrafter"]

SCOPES = ("request", "key", "global")


@register("suffix")
class SuffixDrafter:
    name = "suffix"
    cheap = True

    def __init__(self, scope: str = "key", budget_mib: float = 256.0, branches: int = 3) -> None:
        if scope not in SCOPES:
            raise ValueError(f"suffix scope {scope!r} is unknown; use one of {', '.join(SCOPES)}")
        if not budget_mib > 0:
            raise ValueError(f"suffix budget {budget_mib} MiB is invalid; use a number > 0")
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise ValueError(f"suffix branches = {branches!r} is invalid; use an integer >= 1")
        self.scope = scope
        self.branches = branches
        self._width = 1  # branches offered to the bound target (1 unless it takes trees)
        self.budget = int(budget_mib * (1 << 20))
        self.fingerprint = f"suffix:{MAX_MATCH}"
        self.memories: dict[str, SuffixIndex] = {}  # tenant ("" for all) -> earlier requests
        self._live: dict[int, LiveIndex] = {}
        self._tenant: dict[int, str] = {}

    @classmethod
    def chains(cls, **options) -> SuffixDrafter:
        """The drafter that proposes chains only, registered as `suffix-chain`."""
        d = cls(branches=1, **options)
        d.name = "suffix-chain"
        return d

    def bind(self, target: LM) -> None:
        self._width = self.branches if target.trees else 1

    def _memory(self, tenant: str | None) -> SuffixIndex | None:
        if self.scope == "request":
            return None
        key = (tenant or "") if self.scope == "key" else ""
        mem = self.memories.get(key)
        if mem is None:
            mem = self.memories[key] = SuffixIndex(self.budget)
        return mem

    def begin(self, seq: int, prompt: Sequence[int], tenant: str | None = None) -> None:
        self._live[seq] = live = LiveIndex()
        live.extend(prompt)
        self._tenant[seq] = tenant or ""

    def propose(
        self,
        seq: int,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        sampler: Sampler,
        keep_going: KeepGoing | None = None,
    ) -> Draft:
        if k <= 0:
            return Draft([], None)
        live = self._live.get(seq)
        if live is None or len(context) < len(live):  # not begun, or a new context
            live = self._live[seq] = LiveIndex()
        here = live.find(context)
        mem = self._memory(self._tenant.get(seq))
        before = mem.find(context) if mem is not None else []
        found = [*before, *([here] if here is not None else [])]  # oldest first
        longest = max((o.length for o in found), default=0)
        found = [o for o in found if o.length == longest]
        tokens, parents, conf = tree(found, k, self._width)
        if before and tokens and mem is not None:
            mem.touch(before)
        if not tokens:
            return Draft([], None)
        return Draft(tokens, None, conf, parents).prefix(len(tokens))  # a chain: parents None

    def commit(self, seq: int, accepted: int, emitted: Sequence[int]) -> None:
        return None

    def end(self, seq: int) -> None:
        live = self._live.pop(seq, None)
        tenant = self._tenant.pop(seq, "")
        if live is None or seq < 0:  # not begun; negative ids: the engine's own checks
            return
        mem = self._memory(tenant)
        if mem is None:
            return
        mem.add(live.tokens)
        total = sum(m.nbytes for m in self.memories.values())
        while total > self.budget and len(self.memories) > 1:  # tenants share the budget
            freed = min(self.memories.values(), key=SuffixIndex.oldest).drop_oldest()
            if not freed:
                break
            total -= freed

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return 0

    def measure_cost(self) -> tuple[float, float]:
        return measure_cheap(self)

    def snapshot(self) -> dict:
        """The memory as it is now, for `restore` (cheap: segments are immutable)."""
        return {t: m.snapshot() for t, m in self.memories.items()}

    def restore(self, state: dict) -> None:
        self.memories = {}
        for t, s in state.items():
            self.memories[t] = SuffixIndex(self.budget)
            self.memories[t].restore(s)

    # -- the memory as a file ----------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the memory (every tenant's documents) to `path` (.npz), atomically."""
        path = Path(path)
        arrays: dict[str, np.ndarray] = {}
        for i, (tenant, mem) in enumerate(sorted(self.memories.items())):
            tokens, lengths = mem.dump()
            arrays[f"tenant{i}"] = np.array(tenant)
            arrays[f"tokens{i}"], arrays[f"lengths{i}"] = tokens, lengths
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, scope=np.array(self.scope), **arrays)
        tmp.replace(path)

    def load(self, path: str | Path) -> None:
        """Add the memory saved at `path`; ValueError when it is not such a file."""
        path = Path(path)
        try:
            with np.load(path) as f:
                data = {k: f[k] for k in f.files}
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a suffix memory file ({exc})") from None
        saved = str(data.get("scope", ""))
        if saved != self.scope:
            raise ValueError(
                f"{path} holds a suffix memory of scope {saved!r}; this one is set to "
                f"{self.scope!r} (use --suffix-scope {saved} or another file)"
            )
        i = 0
        while f"tenant{i}" in data:
            tenant = str(data[f"tenant{i}"])
            mem = self._memory(tenant)
            if mem is not None:
                mem.add_documents(data[f"tokens{i}"], data[f"lengths{i}"])
            i += 1


register("suffix-chain")(SuffixDrafter.chains)
