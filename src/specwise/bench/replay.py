"""`specwise bench replay`: the controller and the drafters replayed over recorded greedy
answers and priced at this machine's measured costs, beside what hindsight gets from the same
drafts.

A recording is each prompt's plain greedy answer from the target (`record`). `replay` runs the
engine (`k="auto"` over a set of drafters) against `Recorded`, a stand-in for the target whose
every logits row puts all its weight on the recorded next token: each round proposes, plans,
verifies and commits as it would on the target at temperature 0, where the answers agree, and
is priced as the controller prices it (`Pricing.round_ms`, with the costs held at their
measured values: `frozen`), with every offer the controller asked a cheap drafter for (paid
whether taken or not: the round trace's `offers`) at its cost (`CostModel.offer_cost`: its
measured ms a token times the tokens asked, and what its offers cost beyond that in the
engine, where `costs` hold it). `hindsight` takes at each position the accepted prefix of any
drafter's offer whose round pays best: what deciding when, with which drafter and how far to
draft could get from these drafts, round by round, knowing each round's outcome. Plain decoding
is priced the same way, so a replay's speedups are ratios of priced times, free of the
machine's noise: what the decisions are worth, not how fast a run was (that is
`specwise bench`). Temperature 0 only, and only cheap drafters (`Drafter.cheap`): a draft
model's drafts need its own model run, measured by `specwise bench`."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specwise.acceptance import positions
from specwise.backends.base import LM, check_tree
from specwise.controller.planner import Controller
from specwise.controller.pricing import Batch, Pricing
from specwise.costs import CostModel
from specwise.drafters.base import Draft, Drafter, make_drafters
from specwise.engine import CHEAP_MAX_K, Engine
from specwise.sampling import SamplingParams
from specwise.teacher import Data
from specwise.verify import tree_greedy_match

__all__ = [
    "Recorded", "Recording", "from_bench", "frozen", "hindsight", "plans", "record", "replay",
    "table",
]


@dataclass
class Recording:
    """One prompt and the target's plain greedy answer to it; with `states`, the target's layer
    states at every position of prompt + output ([n, S]: a state-reading drafter's input, as
    `teacher.bench_answers` keeps them, `from_bench`)."""

    category: str
    id: str
    prompt: list[int]
    output: list[int]
    states: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        """The recording without its states (a line of recordings.jsonl)."""
        return {"category": self.category, "id": self.id, "prompt": self.prompt,
                "output": self.output}


def from_bench(data: Data, max_tokens: int | None = None) -> list[Recording]:
    """The recordings of the bench answers in `data` (`teacher.bench_answers`: the target's
    greedy answers to the shipped prompts, its layer states beside them), each answer cut to
    `max_tokens`: a prompt is the positions up to the first whose next token is trained on
    (the answer's), its output the rest; an empty answer makes no recording."""
    out = []
    for q, meta in enumerate(data.meta):
        a, n = int(data.starts[q]), int(data.lengths[q])
        answer = np.flatnonzero(data.train[a : a + n])
        if len(answer) == 0 or not meta.get("greedy"):
            continue
        cut = int(answer[0]) + 1
        end = n if max_tokens is None else min(n, cut + max_tokens)
        if end <= cut:  # an answer that ended at once: nothing to replay
            continue
        tokens = [int(t) for t in data.tokens[a : a + end]]
        out.append(Recording(meta.get("category", "answer"), str(meta.get("name", q)),
                             tokens[:cut], tokens[cut:], data.states(a, a + end)))
    return out


def record(
    target: LM,
    prompts: Sequence[tuple[str, str, list[int]]],
    max_tokens: int,
    progress: Callable[[int], None] | None = None,
) -> list[Recording]:
    """The target's plain greedy answer to each (category, id, prompt ids)."""
    engine = Engine(target)
    out = []
    for category, pid, ids in prompts:
        res = engine.generate(ids, SamplingParams(max_tokens=max_tokens))
        out.append(Recording(category, pid, list(ids), list(res.tokens)))
        if progress:
            progress(1)
    return out


class Recorded:
    """An LM that answers with a recording: `play(rec)` sets the recording, and then every
    logits row of a sequence puts all its weight on the token that follows that row's position
    in rec.prompt + rec.output (on an end-of-sequence token past its end). Everything else —
    vocabulary, tokenizer, whether it takes trees, how a call runs as passes — is `target`'s,
    so drafters and the controller see the target they would."""

    def __init__(self, target: LM, hidden_layers: Sequence[int] = (), hidden_size: int = 0) -> None:
        self.target = target
        self.hidden_layers = tuple(hidden_layers)
        self.vocab_size = target.vocab_size
        self.context_length = target.context_length
        self.eos_token_ids = target.eos_token_ids
        self.tokenizer = target.tokenizer
        self.info = target.info
        self.exact = target.exact
        self.trees = target.trees
        self.hidden_size = hidden_size
        self._truth: list[int] = []
        self._states: np.ndarray | None = None
        self._end = min(target.eos_token_ids, default=0)
        self._cache: dict[int, list[int]] = {}
        self._fed: dict[int, int] = {}  # tokens each sequence's latest call fed

    def play(self, rec: Recording) -> None:
        self._truth = rec.prompt + rec.output
        self._states = rec.states

    def _next(self, position: int) -> int:
        i = position + 1
        return self._truth[i] if i < len(self._truth) else self._end

    def forward(self, batch, last_only=False, rows=None, trees=None) -> list[np.ndarray]:
        out = []
        for i, (seq, tokens) in enumerate(batch):
            cache = self._cache.setdefault(seq, [])
            base = len(cache)
            parents = trees[i] if trees is not None else None
            depth = (
                list(range(len(tokens)))
                if parents is None
                else check_tree(seq, len(tokens), parents)
            )
            cache.extend(tokens)
            self._fed[seq] = len(tokens)
            n = 1 if last_only else (rows[i] if rows is not None else len(tokens))
            picked = depth[-1:] if last_only else depth[:n]
            logits = np.zeros((len(picked), self.vocab_size), np.float32)
            for r, d in enumerate(picked):
                logits[r, self._next(base + d)] = 1.0
            out.append(logits)
        return out

    def keep(self, seq: int, path: Sequence[int]) -> None:
        cache = self._cache[seq]
        start = len(cache) - self._fed[seq]
        fed = cache[start:]
        self._cache[seq] = cache[:start] + [fed[j] for j in path]

    def passes(self, calls):
        return self.target.passes(calls)

    def hidden(self, seq: int) -> None:
        return None

    def hiddens(self, seq: int, start: int) -> np.ndarray | None:
        """The recording's layer states at seq's cached positions from `start` (all kept);
        None for a recording without states."""
        n = self.length(seq)
        if self._states is None or start >= n:
            return None
        return np.asarray(self._states[start:n], dtype=np.float32)

    def hold(self, seq: int, tokens: Sequence[int]) -> None:
        """Make seq's cache `tokens`, as if the target had been fed them (`hindsight`)."""
        self._cache[seq] = list(tokens)

    def length(self, seq: int) -> int:
        return len(self._cache.get(seq, ()))

    def truncate(self, seq: int, n: int) -> None:
        del self._cache.setdefault(seq, [])[n:]

    def release(self, seq: int) -> None:
        self._cache.pop(seq, None)
        self._fed.pop(seq, None)

    def in_use(self) -> int:
        return len(self._cache)


class _Frozen(CostModel):
    """Costs that do not learn from the rounds run (a replay's rounds take no real time)."""

    def observe_verify(self, passes, ms: float) -> None:
        return None

    def observe_draft(self, drafter: str, proposed: int, ms: float) -> None:
        return None

    def observe_overhead(self, ms: float) -> None:
        return None

    def observe_offer(self, drafter: str, tokens: int, ms: float) -> None:
        return None


def frozen(costs: CostModel) -> CostModel:
    """A copy of `costs` that stays at its values however rounds run."""
    c = copy.deepcopy(costs)
    return _Frozen(
        c.target, c.draft_ms_per_token, c.overhead_ms, c.catch_up_ms_per_token, c.batched,
        c.offer_ms,
    )


@dataclass
class Priced:
    """One answer replayed: its priced decode time, plain decoding's for the same tokens, the
    rounds that drafted, and of those the controller planned (not probes) the accepted tokens
    it expected (E(m) - 1 of each plan) and got."""

    category: str
    ms: float
    plain_ms: float
    rounds: int
    drafted: int
    proposed: int
    accepted: int
    planned: int = 0
    expected: float = 0.0
    realised: int = 0


def _plain_ms(pricing: Pricing, rec: Recording) -> float:
    # Round 0 (the prefill's token) is the same for every configuration and is left out.
    return (len(rec.output) - 1) * pricing.round_ms(None, 0, Batch())


def replay(
    target: LM,
    recordings: Sequence[Recording],
    drafters: Sequence[Drafter],
    costs: CostModel,
    progress: Callable[[int], None] | None = None,
    layers: Sequence[int] = (),
) -> list[Priced]:
    """`k="auto"` over `drafters` (fresh ones: they learn from each answer in turn, as in a
    server) on the recordings, in order, priced at `costs`; `layers`: the target layers the
    recordings' states hold (for a drafter that reads them). ValueError if an answer comes out
    other than recorded (a drafter or rule that is not exact)."""
    lm = _stand_in(target, recordings, layers)
    controller = Controller(drafters, frozen(costs))
    engine = Engine(lm, list(drafters), k="auto", controller=controller)  # type: ignore[arg-type]
    pricing = controller.pricing
    out = []
    for rec in recordings:
        lm.play(rec)
        res = engine.generate(rec.prompt, SamplingParams(max_tokens=len(rec.output)))
        if res.tokens != rec.output:
            raise ValueError(f"{rec.id}: the replayed answer differs from the recorded one")
        rounds = res.rounds[1:]
        # the target's call of each round; the drafting is the offers asked, each round's as
        # its trace records them (a draft is a prefix of one: counted once)
        priced = [pricing.round_ms(None, r.proposed, Batch()) for r in rounds]
        offered = sum(
            costs.offer_cost(name, n) for r in res.rounds for name, n in (r.offers or {}).items()
        )
        drafted = [r for r in rounds if r.drafter is not None]
        planned = [(r, pricing.round_ms(r.drafter, r.proposed, Batch())) for r in rounds
                   if r.drafter is not None and not (r.decision or "").startswith("probing")]
        out.append(
            Priced(
                rec.category,
                sum(priced) + offered,
                _plain_ms(pricing, rec),
                len(rounds),
                len(drafted),
                sum(r.proposed for r in drafted),
                sum(r.accepted for r in drafted),
                len(planned),
                sum((r.expected_goodput or 0.0) * c - 1.0 for r, c in planned),
                sum(r.accepted for r, _ in planned),
            )
        )
        if progress:
            progress(1)
    return out


def _accepted_path(draft: Draft, truth: Sequence[int]) -> int:
    """How many tokens greedy verification (`verify.tree_greedy_match`, as the engine runs it)
    accepts of `draft` (a chain or a tree) when the target's answer continues with `truth`:
    the row after a token of depth d holds truth[d + 1] (-1 past its end)."""
    after = [
        truth[d + 1] if d + 1 < len(truth) else -1
        for d in positions(draft.parents, len(draft.tokens))
    ]
    return tree_greedy_match(draft.tokens, draft.shape(), [truth[0], *after]).accepted


def hindsight(
    target: LM,
    recordings: Sequence[Recording],
    drafters: Sequence[Drafter],
    costs: CostModel,
    progress: Callable[[int], None] | None = None,
    layers: Sequence[int] = (),
) -> list[Priced]:
    """Each round, every drafter offers as the engine asks it to (up to CHEAP_MAX_K tokens),
    and hindsight drafts the prefix of an offer's accepted tokens whose round has the best
    goodput (emitted tokens per priced ms; plain decoding when none beats it): each round the
    best it could do knowing its outcome (round by round, not over the whole answer). Fresh
    drafters, the recordings in order, as `replay`."""
    pricing = Pricing(frozen(costs))
    pricing.bind(target)
    lm = _stand_in(target, recordings, layers)
    for d in drafters:
        d.bind(lm)  # type: ignore[arg-type]
    greedy = SamplingParams()
    plain = pricing.round_ms(None, 0, Batch())
    out = []
    for seq, rec in enumerate(recordings):
        lm.play(rec)
        for d in drafters:
            d.begin(seq, rec.prompt)
        context = list(rec.prompt) + rec.output[:1]
        ms, rounds, drafted, proposed = 0.0, 0, 0, 0
        while len(context) - len(rec.prompt) < len(rec.output):
            done = len(context) - len(rec.prompt)
            room = len(rec.output) - done - 1
            truth = rec.output[done:]
            best = (1.0 / plain, None, 0, plain)
            lm.hold(seq, context[:-1])  # the target holds every committed token but the last
            for d in drafters if room > 0 else ():
                draft = d.propose(seq, context, min(room, CHEAP_MAX_K), greedy, None)  # type: ignore[arg-type]
                for m in range(1, _accepted_path(draft, truth) + 1):
                    c = pricing.round_ms(d.name, m, Batch())
                    if (m + 1) / c > best[0]:
                        best = ((m + 1) / c, d.name, m, c)
            _, name, m, c = best
            ms += c
            rounds += 1
            drafted += name is not None
            proposed += m
            context += truth[: m + 1]
        for d in drafters:
            d.end(seq)
        lm.release(seq)
        out.append(
            Priced(rec.category, ms, _plain_ms(pricing, rec), rounds, drafted, proposed, proposed)
        )
        if progress:
            progress(1)
    return out


def _stand_in(target: LM, recordings: Sequence[Recording], layers: Sequence[int]) -> Recorded:
    """The recorded target for `recordings`, with the layer states they hold."""
    width = next((r.states.shape[1] for r in recordings if r.states is not None), 0)
    return Recorded(target, layers if width else (), width)


def speedups(priced: Sequence[Priced]) -> dict[str, float]:
    """Priced plain time over priced time, by category and over all ("all")."""
    cats = sorted({p.category for p in priced})
    out = {}
    for c in [*cats, "all"]:
        ps = [p for p in priced if c in ("all", p.category)]
        out[c] = sum(p.plain_ms for p in ps) / max(sum(p.ms for p in ps), 1e-9)
    return out


def table(results: dict[str, list[Priced]]) -> list[str]:
    """Markdown: a row per category (and all), a column per configuration."""
    names = list(results)
    by = {n: speedups(results[n]) for n in names}
    rows = list(next(iter(by.values()))) if by else []
    lines = [
        "| category | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in rows:
        cells = " | ".join(f"{by[n][c]:.2f}" for n in names)
        lines.append(f"| {'**all**' if c == 'all' else c} | {cells} |")
    return lines


def plans(results: dict[str, list[Priced]]) -> list[str]:
    """Markdown: for each `auto` configuration, its drafted rounds, how many the controller
    planned (the rest probed), and the accepted tokens a planned round expected and got."""
    lines = ["| configuration | drafted rounds | planned | accepted a planned round: expected "
             "| got |", "|---|---|---|---|---|"]
    for name, ps in results.items():
        if not name.startswith("auto"):
            continue
        n = sum(p.planned for p in ps)
        exp = sum(p.expected for p in ps) / n if n else 0.0
        got = sum(p.realised for p in ps) / n if n else 0.0
        lines.append(f"| {name} | {sum(p.drafted for p in ps)} | {n} | {exp:.2f} | {got:.2f} |")
    return lines


def run(
    target: LM,
    recs: Sequence[Recording],
    sets: Sequence[Sequence[str]],
    options: dict[str, dict],
    costs: CostModel,
    out: Path,
    progress: Callable[[str, int], Callable[[int], None]],
    layers: Sequence[int] = (),
) -> list[str]:
    """Replay each drafter set and its hindsight bound over the recordings `recs` (`record`,
    or `from_bench` with the layer states `layers` hold), write recordings.jsonl, replay.json
    and replay.md to `out`; returns replay.md's lines: the cost curve priced at, the table, and
    how the plans came true."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "recordings.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r.to_dict()) + "\n")
    results: dict[str, list[Priced]] = {}
    for names in sets:
        label = "+".join(names)
        results[f"auto[{label}]"] = replay(
            target,
            recs,
            make_drafters(names, None, options),
            costs,
            progress(f"replaying auto[{label}]", len(recs)),
            layers,
        )
        results[f"hindsight[{label}]"] = hindsight(
            target,
            recs,
            make_drafters(names, None, options),
            costs,
            progress(f"hindsight[{label}]", len(recs)),
            layers,
        )
    curve = ", ".join(f"{n}: {costs.target(n):.1f}" for n in (1, 2, 4, 8, 16))
    lines = [f"priced at ms per target call by tokens in it ({curve})", *table(results), "",
             *plans(results)]
    (out / "replay.json").write_text(
        json.dumps({n: [asdict(p) for p in ps] for n, ps in results.items()}, indent=1)
    )
    (out / "replay.md").write_text("\n".join(lines) + "\n")
    return lines
