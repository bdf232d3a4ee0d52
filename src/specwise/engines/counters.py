"""Speculative-decoding counters read from a server's Prometheus text, and the figures they give
under specwise's definitions (`specwise.trace`).

Each engine counts, per sequence, its verification steps that checked a draft, the tokens
drafted, the tokens accepted (the kept prefix) and, by draft position, how many steps accepted
that position. Where each count is read:

| count | specwise | llama-server (`--metrics`) | vLLM |
|---|---|---|---|
| drafts | `specwise_drafts_total` | `llamacpp:spec_decode_num_drafts_total` | `vllm:spec_decode_num_drafts_total` |
| proposed | `specwise_proposed_tokens_total` | `llamacpp:spec_decode_num_draft_tokens_total` | `vllm:spec_decode_num_draft_tokens_total` |
| accepted | `specwise_accepted_tokens_total` | `llamacpp:spec_decode_num_accepted_tokens_total` | `vllm:spec_decode_num_accepted_tokens_total` |
| accepted at i | `specwise_accepted_by_position_total{position}` | `llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position}` | `vllm:spec_decode_num_accepted_tokens_per_pos_total{position}` |

(every series summed over its other labels: specwise's drafters, vLLM's engines and models).
Counters only grow, so a run's figures come from the difference of two reads (`Counters.minus`).
llama-server adds a request's counts when the request ends; read after the run's requests end.
SGLang exposes no counters, only gauges over a recent window (`sglang:spec_accept_length`,
τ; `sglang:spec_accept_rate`): `sglang_gauges` reads them as they are.

Figures (`Counters.figures`), the same for every engine:
- acceptance rate = accepted / proposed (as `specwise.trace`);
- τ = 1 + accepted / drafts: tokens a verification step with a draft emits, the bonus or
  recovered token included. Unlike the τ of specwise's traces (emitted over *all* rounds,
  plain ones too), it counts only steps that checked a draft, which is what every engine can
  report;
- mean draft length = proposed / drafts;
- acceptance_per_position[i] = accepted at i / drafts (unconditional, as `specwise.trace`);
- alpha_per_position[i] = accepted at i / accepted at i−1 (i = 0: / drafts): the conditional
  acceptance of `specwise.trace`, exact when every draft reached position i (a fixed length);
  counters cannot tell a draft that stopped short, so with drafts of varying length it reads
  low.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["ENGINES", "Counters", "read", "sglang_gauges"]

# engine -> (drafts, proposed, accepted, accepted by position) series names
ENGINES: dict[str, tuple[str, str, str, str]] = {
    "specwise": (
        "specwise_drafts_total",
        "specwise_proposed_tokens_total",
        "specwise_accepted_tokens_total",
        "specwise_accepted_by_position_total",
    ),
    "llama-server": tuple(
        f"llamacpp:spec_decode_num_{n}_total"
        for n in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos")
    ),
    "vllm": tuple(
        f"vllm:spec_decode_num_{n}_total"
        for n in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos")
    ),
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of Prometheus text (comments skipped)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or line.lstrip().startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


@dataclass(frozen=True)
class Counters:
    """An engine's speculative counters at one time (or a run's difference of two reads)."""

    engine: str
    drafts: float
    proposed: float
    accepted: float
    accepted_at: tuple[float, ...]  # by draft position

    def minus(self, before: Counters) -> Counters:
        """What was counted since `before` (a read of the same server)."""
        return self._add(before, -1.0)

    def plus(self, other: Counters) -> Counters:
        """Two runs' counts together."""
        return self._add(other, 1.0)

    def _add(self, other: Counters, sign: float) -> Counters:
        n = max(len(self.accepted_at), len(other.accepted_at))
        mine = self.accepted_at + (0.0,) * (n - len(self.accepted_at))
        theirs = other.accepted_at + (0.0,) * (n - len(other.accepted_at))
        return Counters(
            self.engine,
            self.drafts + sign * other.drafts,
            self.proposed + sign * other.proposed,
            self.accepted + sign * other.accepted,
            tuple(x + sign * y for x, y in zip(mine, theirs, strict=True)),
        )

    def figures(self) -> dict:
        """The figures of the module docstring (None where a denominator is 0)."""

        def ratio(a: float, b: float) -> float | None:
            return a / b if b else None

        at = list(self.accepted_at)
        while at and not at[-1]:
            at.pop()  # positions never accepted past the last one that was
        before = [self.drafts, *at][: len(at)]  # what position i was conditioned on
        return {
            "engine": self.engine,
            "drafts": self.drafts,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": ratio(self.accepted, self.proposed),
            "tau": None if not self.drafts else 1.0 + self.accepted / self.drafts,
            "mean_draft_length": ratio(self.proposed, self.drafts),
            "acceptance_per_position": [ratio(a, self.drafts) for a in at],
            "alpha_per_position": [ratio(a, b) for a, b in zip(at, before, strict=True)],
        }


def read(text: str, engine: str | None = None) -> Counters | None:
    """The speculative counters in `text` (a /metrics body) of `engine` (an ENGINES name), or
    of whichever engine's series it holds; None where it holds none (speculation never ran
    there, or the server does not count it)."""
    samples = _samples(text)
    names = {s[0] for s in samples}
    for name in [engine] if engine else list(ENGINES):
        drafts, proposed, accepted, per_pos = ENGINES[name]
        if not names & {drafts, proposed, accepted}:
            continue

        def total(series: str) -> float:
            return math.fsum(v for n, _, v in samples if n == series)

        at: dict[int, float] = {}
        for n, labels, v in samples:
            if n == per_pos and labels.get("position", "").isdigit():
                i = int(labels["position"])
                at[i] = at.get(i, 0.0) + v
        by_pos = tuple(at.get(i, 0.0) for i in range(max(at) + 1)) if at else ()
        return Counters(name, total(drafts), total(proposed), total(accepted), by_pos)
    return None


def sglang_gauges(text: str) -> dict[str, float] | None:
    """SGLang's speculative gauges as read (window averages, not counters): {"tau",
    "acceptance_rate"} (the mean over its ranks); None where it shows neither."""
    out: dict[str, float] = {}
    for key, series in (
        ("tau", "sglang:spec_accept_length"),
        ("acceptance_rate", "sglang:spec_accept_rate"),
    ):
        values = [v for n, _, v in _samples(text) if n == series]
        if values:
            out[key] = math.fsum(values) / len(values)
    return out or None
