"""A round you can trust: atomic rounds under injected faults, and timing that adds up.

Fault injection: three requests in flight, a fault at one step of one round (the drafter's
propose or commit, the target forward, the acceptance rule, the trace sink), run the way the
server's scheduler runs a batch (a round that raises is retried a request at a time; a request
whose retry raises too ends as failed). Every output must equal the run without the fault, bit
for bit (sampled requests too: a failed round draws no random number), a failing drafter only
turns its request to plain decoding, and no sequence is left in any cache."""

from __future__ import annotations

import pytest

from specwise import Engine, SamplingParams
from specwise.drafters import ModelDrafter
from specwise.oracle import plain_decode
from specwise.trace import JsonlSink
from toy import ToyLM

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
ROUND = 3  # the round (of the batch) in which the fault strikes


class Fault(Exception):
    pass


class Injector:
    """Raises Fault at the `at`-th call of a point (counted over the whole run), `times` times."""

    def __init__(self, at: int, times: int = 1) -> None:
        self.at, self.times, self.calls = at, times, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.at <= self.calls < self.at + self.times:
            raise Fault(f"injected at call {self.calls}")


class FaultyLM(ToyLM):
    """A ToyLM whose forward can fail after it fed the tokens (the worst moment)."""

    inject = None

    def forward(self, batch, last_only=False, rows=None, trees=None):
        out = super().forward(batch, last_only, rows, trees)
        if not last_only and self.inject is not None:
            self.inject()
        return out


def run(engine: Engine, params: list[SamplingParams]) -> list[tuple[list[int] | None, dict]]:
    """The scheduler's way: a batch, and a failed batch round retried a request at a time."""
    reqs = [engine.start(p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    failed: set[int] = set()
    while any(not r.done and i not in failed for i, r in enumerate(reqs)):
        live = [r for i, r in enumerate(reqs) if i not in failed]
        try:
            engine.step(live)
        except Fault:
            for i, r in enumerate(reqs):
                if i in failed or r.done:
                    continue
                try:
                    engine.step([r])
                except Fault:
                    failed.add(i)
    out = []
    for i, r in enumerate(reqs):
        res = engine.finish(r)
        out.append((None if i in failed else res.tokens, dict(r.drafter_errors)))
    return out


def make(target: ToyLM, draft: ToyLM, sink=None) -> Engine:
    return Engine(target, ModelDrafter(draft), k=3, trace=sink)


def arm(point: str, engine: Engine, inject: Injector) -> None:
    """Make the target forward or the acceptance rule of `engine` call `inject` in each round
    of the loop (not the prefill's)."""
    if point == "forward":
        engine.target.inject = inject
        return
    verify = engine._verify

    def faulty_verify(r, *a):
        if r.rounds:
            inject()
        return verify(r, *a)

    engine._verify = faulty_verify


SAMPLED = [SamplingParams(temperature=1.0, seed=s, max_tokens=24) for s in (1, 2, 3)]
GREEDY = [SamplingParams(max_tokens=24)] * 3


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("point", ["forward", "verify", "trace"])
def test_a_fault_in_a_round_changes_no_output_and_leaks_nothing(point, params, tmp_path):
    want = run(make(ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)), params)
    target, draft = FaultyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    sink = JsonlSink(tmp_path / "rounds.jsonl")
    engine = make(target, draft, sink)
    inject = Injector(at=ROUND)
    if point != "trace":
        arm(point, engine, inject)
    else:
        write = sink.write

        def faulty_write(rt):
            if rt.round:  # a round of the loop, not the prefill's
                inject()
            write(rt)

        sink.write = faulty_write
    got = run(engine, params)
    assert inject.calls >= ROUND  # the fault did strike
    assert got == want
    assert not target.caches and not draft.caches  # nothing leaked
    if point == "trace":
        assert engine.trace is None  # dropped, the rounds went on


@pytest.mark.parametrize("point", ["forward", "verify"])
def test_a_request_that_keeps_failing_ends_alone(point):
    """A fault that strikes again on the retry fails that one request; the others' outputs
    are those of the run without it."""
    want = run(make(ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)), SAMPLED)
    target, draft = FaultyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    engine = make(target, draft)
    inject = Injector(at=ROUND, times=2)  # the batch round, then the first retry
    arm(point, engine, inject)
    got = run(engine, SAMPLED)
    assert [g for g, _ in got] == [None, *(w for w, _ in want[1:])]
    assert not target.caches and not draft.caches


@pytest.mark.parametrize("method", ["propose", "commit"])
def test_a_failing_drafter_turns_its_request_to_plain_decoding(method):
    target, draft = ToyLM(vocab=12, seed=1), ToyLM(vocab=12, seed=2)
    engine = make(target, draft)
    d = engine.drafter
    inject = Injector(at=ROUND)
    real = getattr(d, method)

    def faulty(*a, **kw):
        inject()
        return real(*a, **kw)

    setattr(d, method, faulty)
    got = run(engine, GREEDY)
    for (tokens, _), p in zip(got, PROMPTS, strict=True):
        assert tokens == plain_decode(target, p, GREEDY[0])
    assert sum(1 for _, e in got if e) == 1  # one request lost its drafter
    failed = next(i for i, (_, e) in enumerate(got) if e)
    assert "Fault" in got[failed][1]["model"]
    assert not target.caches and not draft.caches


def test_every_millisecond_of_a_request_is_in_one_field():
    """prefill + drafters' prefill + Σ (draft + verify + overhead) over the rounds = the
    request's wall time, within 1%, alone and in a batch."""
    slow = ToyLM(vocab=12, seed=1, delay_ms=(2.0, 0.5))
    engine = Engine(slow, ModelDrafter(ToyLM(vocab=12, seed=2, delay_ms=(1.0, 0.2))), k=3)
    results = [engine.generate(PROMPTS[0], SamplingParams(max_tokens=30))]
    reqs = [engine.start(p, SamplingParams(max_tokens=10 * (i + 1))) for i, p in enumerate(PROMPTS)]
    while reqs:  # as the server does it: a request is finished once its last round is
        engine.step(reqs)
        results += [engine.finish(r) for r in reqs if r.done]
        reqs = [r for r in reqs if not r.done]
    for res in results:
        s = res.summary
        parts = s.prefill_ms + s.draft_prefill_ms + sum(r.round_ms for r in res.rounds)
        assert parts == pytest.approx(
            s.total_ms, rel=0.01, abs=0.5
        )  # abs: the tail before `finish`
    by_step: dict[int, list] = {}
    for res in results[1:]:
        for r in res.rounds[1:]:
            by_step.setdefault(r.step, []).append(r)
    assert all(len(rs) == rs[0].batch_size for rs in by_step.values())  # a step's rounds
