"""Prometheus metrics of one server (its own registry, so several servers can live in one
process, as in tests). Counts come from the engine's RoundTraces; this module only records."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specwise.trace import RoundTrace

__all__ = ["Metrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "specwise_requests", "Requests by final status", ["status"], registry=r
        )
        self.queue_depth = Gauge("specwise_queue_depth", "Requests waiting to start", registry=r)
        self.running = Gauge(
            "specwise_running_batch_size", "Sequences in the running batch", registry=r
        )
        self.ttft = Histogram(
            "specwise_ttft_seconds", "Time to first token", buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "specwise_inter_token_latency_seconds",
            "Time between emitted tokens (a round's time over its tokens)",
            buckets=_LATENCY,
            registry=r,
        )
        self.emitted = Counter("specwise_emitted_tokens", "Emitted tokens", registry=r)
        self.proposed = Counter(
            "specwise_proposed_tokens", "Draft tokens proposed", ["drafter"], registry=r
        )
        self.accepted = Counter(
            "specwise_accepted_tokens", "Draft tokens accepted", ["drafter"], registry=r
        )
        self.drafts = Counter(
            "specwise_drafts", "Rounds that verified a draft", ["drafter"], registry=r
        )
        self.accepted_at = Counter(
            "specwise_accepted_by_position",
            "Accepted draft tokens by draft position",
            ["drafter", "position"],
            registry=r,
        )
        self.proposed_at = Counter(
            "specwise_proposed_by_position",
            "Proposed draft tokens by draft position (accepted / proposed: the acceptance rate "
            "at a position)",
            ["drafter", "position"],
            registry=r,
        )
        self.adapt_steps = Counter(
            "specwise_adapt_steps",
            "Training steps of the adapting heads (serve --adapt)",
            registry=r,
        )
        self.adapt_idle_steps = Counter(
            "specwise_adapt_idle_steps",
            "Of the adapting drafter's training steps, those taken while no request was in",
            registry=r,
        )
        self.adapt_swaps = Counter(
            "specwise_adapt_swaps", "Adapted weights swapped into the drafter", registry=r
        )
        self.adapt_examples = Counter(
            "specwise_adapt_examples", "Positions of served requests learnt from", registry=r
        )
        self.adapt_loss = Gauge(
            "specwise_adapt_loss", "Moving average of the adapting heads' training loss", registry=r
        )
        self._adapt_seen = {"steps": 0, "idle_steps": 0, "swaps": 0, "examples": 0}
        self.draft_seconds = Counter("specwise_draft_seconds", "Time spent drafting", registry=r)
        self.verify_seconds = Counter(
            "specwise_verify_seconds", "Time in target forwards", registry=r
        )
        self.rounds = Counter("specwise_rounds", "Rounds by configuration", ["drafter"], registry=r)

    def observe_round(self, rt: RoundTrace, first: bool) -> None:
        name = rt.drafter or "plain"
        self.rounds.labels(name).inc()
        self.emitted.inc(rt.emitted)
        if rt.proposed:
            self.proposed.labels(name).inc(rt.proposed)
            self.accepted.labels(name).inc(rt.accepted)
            self.drafts.labels(name).inc()
            for i in range(rt.accepted):
                self.accepted_at.labels(name, str(i)).inc()
            for i in range(rt.reach):
                self.proposed_at.labels(name, str(i)).inc()
        if rt.emitted and not first:
            per = rt.round_ms / 1000.0 / rt.emitted
            for _ in range(rt.emitted):
                self.itl.observe(per)

    def observe_step(self, draft_ms: float, verify_ms: float) -> None:
        """Once per round of the whole batch (its times are shared by the batch)."""
        self.draft_seconds.inc(draft_ms / 1000.0)
        self.verify_seconds.inc(verify_ms / 1000.0)

    def observe_adapter(self, stats: dict) -> None:
        """The adapter's totals now (`Adapter.stats`), before a render."""
        for name, counter in (
            ("steps", self.adapt_steps),
            ("idle_steps", self.adapt_idle_steps),
            ("swaps", self.adapt_swaps),
            ("examples", self.adapt_examples),
        ):
            counter.inc(max(0, stats[name] - self._adapt_seen[name]))
            self._adapt_seen[name] = stats[name]
        if stats["loss"] is not None:
            self.adapt_loss.set(stats["loss"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
