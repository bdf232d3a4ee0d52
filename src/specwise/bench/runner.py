"""The run matrix: every (drafter, k) configuration against plain decoding, side by side.

For each prompt, repeat and sampling setting, the plain baseline and every speculative
configuration run one after another in the same process on the same target (their order rotated
from prompt to prompt), after a warm-up. Each request records its summary and rounds; then the
equivalence checks run outside the timed part:

- greedy: tokens must equal plain's; a divergence is reported with the target's top-2 logit
  gap at the first differing position. A near-tie is allowed, anything else is a failure; what
  counts as near is measured, not assumed: before the run, `numeric_noise` compares a
  multi-token forward with one-token forwards of the same tokens, and a gap below
  NEAR_TIE_FACTOR x the largest change it saw in a top-2 gap is a near-tie;
- sampled: the target's mean log-probability (temperature 1) of the generated tokens, paired
  by prompt against plain; its difference must be within noise if the distribution is exact.

With `Options.lossy`, every speculative configuration also runs, at temperatures > 0, under
each lossy acceptance rule named (`spec` + " (lossy: RULE)"): the same seed as its exact run,
recording how far it follows that run's sample (`same_as_exact`, `exact_prefix`) beside the
mean log-probability; `figures` keeps these out of every exact figure.

A drafter that remembers earlier requests (suffix) learns from the run's earlier prompts, as
it would in use, but never from its own prompt: not from the warm-up, not from another repeat
or sampling setting of the same prompt. Each sampling setting has a memory of its own, as if
it were a run of its own: every repeat of a prompt starts from that memory as it was after the
setting's previous prompt.

This module runs and records; `figures` computes the figures and `report` presents them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specwise.backends.base import LM, Reserved
from specwise.bench import humaneval
from specwise.bench.ties import NEAR_TIE_FACTOR
from specwise.bench.workloads import HUMANEVAL, render
from specwise.controller import Controller
from specwise.detok import pieces
from specwise.drafters import DRAFT_MODEL, make_drafters
from specwise.engine import Engine
from specwise.lossy import EXACT
from specwise.prompts import CATEGORIES, Prompt
from specwise.sampling import SamplingParams

__all__ = [
    "BASELINE",
    "LOSSY",
    "NEAR_TIE_FACTOR",
    "Config",
    "Options",
    "Runner",
    "greedy_divergence",
    "logits_after",
    "numeric_noise",
    "top2_gap",
]

BASELINE = "plain on "  # + backend: plain decoding of the same model on another backend or mode
LOSSY = " (lossy: "  # + rule + ")": a speculative configuration under a lossy acceptance rule


@dataclass(frozen=True)
class Config:
    # "plain", a drafter name, "auto" (the controller over all drafters) or "auto[a+b]" (the
    # controller over drafters a and b only)
    drafter: str
    k: int | str  # 0 for plain, a fixed k, or "auto"
    temperature: float
    top_p: float
    acceptance: str = EXACT  # a lossy rule (`lossy`): measured apart, never in exact figures

    @property
    def engine(self) -> str:
        """The engine that runs it (its spec with the exact rule)."""
        if self.drafter == "plain" or self.drafter.startswith((BASELINE, "auto[")):
            return self.drafter
        return "auto" if self.k == "auto" else f"{self.drafter} k={self.k}"

    @property
    def spec(self) -> str:
        lossy = "" if self.acceptance == EXACT else f"{LOSSY}{self.acceptance})"
        return self.engine + lossy

    @property
    def sampling(self) -> str:
        return f"T={self.temperature:g}" + (f" top_p={self.top_p:g}" if self.top_p < 1 else "")

    @property
    def key(self) -> str:
        return f"{self.spec} | {self.sampling}"


@dataclass
class Options:
    drafters: list[str] = field(default_factory=lambda: ["model", "ngram"])
    drafter_options: dict[str, dict] = field(default_factory=dict)  # by name (not model's lm)
    ks: list[int | str] = field(default_factory=lambda: [2, 4, 6, 8, "auto"])
    fixed_drafters: list[str] | None = None  # drafters run at the fixed k's (None: all)
    auto_sets: list[list[str]] = field(default_factory=list)  # more auto engines, over these
    temperatures: list[float] | None = None  # None: each category's default
    top_ps: list[float] | None = None
    max_tokens: int = 128
    repeats: int = 1
    multi_turn: bool = False
    seed: int = 0
    lossy: list[str] = field(default_factory=list)  # lossy rules, run beside at temperature > 0


class Runner:
    """Runner(target, draft_lm, options, baseline=None): builds one engine per configuration
    and runs them. baseline: the same target on another backend (mainline llama.cpp) or in
    the other mode (exact or default), whose plain decoding runs beside the rest as `plain on
    <backend>[ (mode)]` (timed, never checked for equivalence: two libraries or modes may
    round a near-tie differently)."""

    def __init__(
        self, target: LM, draft_lm: LM | None, options: Options, baseline: LM | None = None
    ) -> None:
        self.target, self.options = target, options
        if set(DRAFT_MODEL) & set(options.drafters) and draft_lm is None:
            raise ValueError("a draft model's drafter needs a draft model (--draft or --pair)")
        self._draft_lm = draft_lm
        self.engines: dict[str, Engine] = {"plain": Engine(target)}
        if baseline is not None:
            mode = {True: " (exact)", False: " (default mode)"}[baseline.info.exact]
            name = baseline.info.backend + (
                "" if baseline.info.exact == target.info.exact else mode
            )
            self.engines[BASELINE + name] = Engine(baseline)
        self.noise = {"logit": 0.0, "top2_gap": 0.0}
        self.calibrated: dict[int, float] = {}  # the target's cost curve `auto` starts from
        self.near_tie = 0.0
        numeric = [k for k in options.ks if k != "auto" and k != 0]
        for name in options.drafters:
            if options.fixed_drafters is not None and name not in options.fixed_drafters:
                continue
            for k in numeric:
                self.engines[f"{name} k={k}"] = Engine(target, self._drafters([name]), k=k)
        if "auto" in options.ks:
            # A fresh controller (nothing learnt in earlier processes), so runs are repeatable;
            # it still learns from request to request within the run, as a server would.
            for spec, names in [("auto", options.drafters)] + [
                (f"auto[{'+'.join(names)}]", names) for names in options.auto_sets
            ]:
                drafters = self._drafters(names)
                controller = Controller.calibrated(target, drafters, remember=False)
                self.engines[spec] = Engine(target, drafters, k="auto", controller=controller)
                self.calibrated = dict(controller.costs.target.base)

    def _drafters(self, names: list[str]):
        return make_drafters(names, self._draft_lm, self.options.drafter_options)

    def configs(self, category: str) -> list[Config]:
        cat = CATEGORIES.get(category)
        temps = self.options.temperatures or [cat.temperature if cat else 0.0]
        if self.options.top_ps:
            top_ps = self.options.top_ps
        else:
            top_ps = [cat.top_p if cat and not self.options.temperatures else 1.0]
        out = []
        for t in temps:
            for p in top_ps if t > 0 else [1.0]:
                for spec in self.engines:
                    drafter, _, k = spec.partition(" k=")
                    auto = spec == "auto" or spec.startswith("auto[")
                    k_val: int | str = int(k) if k else ("auto" if auto else 0)
                    out.append(Config(drafter, k_val, t, p))
                    if t > 0 and (k or auto):  # a lossy rule changes only what drafts
                        out += [Config(drafter, k_val, t, p, rule) for rule in self.options.lossy]
        return out

    # -- running -----------------------------------------------------------------------------
    def _replies(self, prompt: Prompt) -> list[str]:
        """Assistant replies for the earlier turns of a multi-turn prompt (greedy, plain)."""
        replies: list[str] = []
        tok = self.target.tokenizer
        for i in range(len(prompt.turns) - 1):
            ids = render(tok, prompt.turns[: i + 1], replies)
            res = self.engines["plain"].generate(
                ids, SamplingParams(max_tokens=self.options.max_tokens)
            )
            replies.append(res.text or "")
        return replies

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if self.options.multi_turn and len(prompt.turns) > 1:
            return render(self.target.tokenizer, prompt.turns, self._replies(prompt))
        return render(self.target.tokenizer, prompt.turns[:1])

    def _memories(self) -> list[tuple[Any, Any]]:
        """(drafter, its memory now) for each drafter that remembers earlier requests (it has
        `snapshot` and `restore`)."""
        return [
            (d, d.snapshot())
            for eng in self.engines.values()
            for d in eng.drafters
            if hasattr(d, "snapshot")
        ]

    def warm_up(self, ids: list[int]) -> None:
        memories = self._memories()
        for eng in self.engines.values():
            eng.generate(ids, SamplingParams(max_tokens=8))
        for d, state in memories:
            d.restore(state)
        self.noise = numeric_noise(self.target, ids)
        # Exact mode allows no divergence at all: every one is a failure.
        self.near_tie = -math.inf if self.target.exact else NEAR_TIE_FACTOR * self.noise["top2_gap"]

    def run(
        self,
        prompts: Sequence[Prompt],
        on_request: Callable[[dict, list[dict]], None],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Run the matrix; `on_request(record, rounds)` receives each finished request."""
        opts = self.options
        for pi, prompt in enumerate(prompts):
            ids = self.prompt_ids(prompt)
            if pi == 0:
                self.warm_up(ids)
                start = self._memories()
                lineage: dict[str, list] = {}  # sampling -> memories after its last prompt
            before = dict(lineage)
            for rep in range(opts.repeats):
                configs = self.configs(prompt.category)
                for sampling in dict.fromkeys(c.sampling for c in configs):
                    for d, state in before.get(sampling, start):
                        d.restore(state)
                    group = [c for c in configs if c.sampling == sampling]
                    shift = (pi + rep) % len(group)
                    group = group[shift:] + group[:shift]  # rotate the order
                    results = {}
                    for cfg in group:
                        params = SamplingParams(
                            temperature=cfg.temperature,
                            top_p=cfg.top_p,
                            seed=opts.seed + 1000 * pi + rep,
                            max_tokens=opts.max_tokens,
                        )
                        res = self.engines[cfg.engine].generate(ids, params, cfg.acceptance)
                        results[cfg] = res
                        if progress:
                            progress(1)
                    lineage[sampling] = self._memories()
                    self._check_and_emit(prompt, rep, ids, results, on_request)

    def _check_and_emit(self, prompt, rep, ids, results, on_request) -> None:
        plain = next(r for c, r in results.items() if c.drafter == "plain")
        exact = {c.engine: r for c, r in results.items() if c.acceptance == EXACT}
        greedy = next(iter(results)).temperature == 0.0
        logprob = (
            {} if greedy else {c: self._mean_logprob(ids, r.tokens) for c, r in results.items()}
        )
        tok = self.target.tokenizer
        for cfg, res in results.items():
            check: dict = {}
            if cfg.drafter.startswith(BASELINE):
                pass  # another library: timed only
            elif greedy:
                check = self._greedy_check(ids, plain.tokens, res.tokens)
            else:
                check = {"mean_logprob": logprob[cfg], "n_tokens": len(res.tokens)}
            if prompt.category == HUMANEVAL and not cfg.drafter.startswith(BASELINE):
                check["passed"] = humaneval.passes(humaneval.problems()[prompt.id], res.text)
            if cfg.acceptance != EXACT:  # how far it follows the exact rule's sample
                ref = exact[cfg.engine].tokens
                check["same_as_exact"] = res.tokens == ref
                check["exact_prefix"] = _common_prefix(res.tokens, ref) / max(1, len(ref))
            record = {
                "config": cfg.key,
                "spec": cfg.spec,
                "drafter": cfg.drafter,
                "k": cfg.k,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "acceptance": cfg.acceptance,
                "sampling": cfg.sampling,
                "category": prompt.category,
                "prompt_id": prompt.id,
                "repeat": rep,
                "prompt_tokens": len(ids),
                "tokens": res.tokens,
                "pieces": None if tok is None else pieces(tok, res.tokens, ids),
                "finish_reason": res.finish_reason,
                "summary": res.summary.to_dict(),
                "check": check,
            }
            rounds = [
                {
                    "config": cfg.key,
                    "category": prompt.category,
                    "prompt_id": prompt.id,
                    "repeat": rep,
                    **r.to_dict(),
                }
                for r in res.rounds
            ]
            on_request(record, rounds)

    # -- equivalence checks (untimed) --------------------------------------------------------
    def _greedy_check(self, ids: list[int], plain: list[int], got: list[int]) -> dict:
        return greedy_divergence(self.target, ids, plain, got, self.near_tie)

    def _mean_logprob(self, ids: list[int], out: list[int]) -> float:
        if not out:
            return math.nan
        logits = logits_after(self.target, ids, out).astype(np.float64)  # [n, V]
        m = logits.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        return float(np.mean(logits[np.arange(len(out)), out] - lse))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def logits_after(lm: LM, ids: list[int], out: list[int]) -> np.ndarray:
    """The target's logits [len(out), V] at each position of `out`, teacher-forced after `ids`."""
    lm.release(Reserved.CHECK)
    try:
        if len(ids) > 1:
            lm.forward([(Reserved.CHECK, ids[:-1])], last_only=True)
        return lm.forward([(Reserved.CHECK, [ids[-1], *out[:-1]])])[0]
    finally:
        lm.release(Reserved.CHECK)


def top2_gap(row: np.ndarray) -> float:
    """How far a row of logits' highest value lies above its second."""
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def numeric_noise(lm: LM, ids: list[int], sizes: Sequence[int] = (2, 5, 9)) -> dict:
    """How much a multi-token forward differs from one-token forwards of the same tokens:
    the largest |difference| of a logit, and of a row's top-2 gap."""
    worst_logit = worst_gap = 0.0
    starts = sorted({max(1, len(ids) // 4), max(1, len(ids) // 2)})
    for start in starts:
        for n in sizes:
            window = ids[start : start + n]
            if len(window) < 2:
                continue
            lm.release(Reserved.CHECK)
            try:
                lm.forward([(Reserved.CHECK, ids[:start])], last_only=True)
                many = lm.forward([(Reserved.CHECK, window)])[0]
                lm.truncate(Reserved.CHECK, start)
                one = np.stack([lm.forward([(Reserved.CHECK, [t])])[0][0] for t in window])
            finally:
                lm.release(Reserved.CHECK)
            worst_logit = max(worst_logit, float(np.abs(many - one).max()))
            for a, b in zip(many, one, strict=True):
                worst_gap = max(worst_gap, abs(top2_gap(a) - top2_gap(b)))
    return {"logit": worst_logit, "top2_gap": worst_gap}


def greedy_divergence(
    lm: LM, ids: list[int], ref: list[int], got: list[int], near_tie: float
) -> dict:
    """Where two greedy outputs part, and the target's top-2 logit gap there (along `ref`)."""
    if got == ref:
        return {"match": True}
    n = next(
        (i for i, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b),
        min(len(ref), len(got)),
    )
    if n >= len(ref):  # `got` is longer: compare at ref's end
        return {"match": False, "position": n, "top2_gap": math.nan, "near_tie": False}
    gap = top2_gap(logits_after(lm, ids, ref[: n + 1])[n])
    return {"match": False, "position": n, "top2_gap": gap, "near_tie": gap <= near_tie}
