"""The cost model: calls priced as the passes they run in, learnt from the calls observed."""

from __future__ import annotations

import pytest

from specwise.backends.curves import CostCurve
from specwise.backends.llama_cpp import LlamaCppLM, equal_passes
from specwise.costs import CostModel
from toy import ToyLM


def in_slots(*tokens):
    return list(enumerate(tokens))


def test_llama_cpp_runs_a_call_as_equal_passes_over_consecutive_slots():
    assert equal_passes(in_slots(1)) == [(1, 1)]
    assert equal_passes(in_slots(1, 1, 1, 1)) == [(4, 1)]
    assert equal_passes(in_slots(5, 1, 1, 1)) == [(4, 1), (1, 4)]
    assert equal_passes(in_slots(1, 3, 3, 5)) == [(4, 1), (3, 2), (1, 2)]
    assert equal_passes(in_slots(1, 5, 1, 5)) == [(4, 1), (1, 4), (1, 4)]  # runs break
    assert equal_passes([(3, 1), (0, 1), (2, 1)]) == [(1, 1), (2, 1)]  # slot 1 is free
    assert equal_passes([(0, 1), (2, 1), (4, 1), (6, 1)]) == [(1, 1)] * 4
    assert equal_passes(in_slots(4, 4, 0)) == [(2, 4)]
    assert equal_passes([]) == []
    assert equal_passes(in_slots(300, 300), n_ubatch=512) == [(2, 256), (2, 44)]


def test_a_llama_cpp_lm_keeps_its_sequences_in_the_lowest_slots_and_reports_its_split(smollm2_path):
    lm = LlamaCppLM(smollm2_path, context_length=64, max_sequences=4)
    for seq in (10, 11, 12):
        lm.forward([(seq, [1, 2])], last_only=True)
    assert lm.passes([(12, 1), (10, 1), (11, 1)]) == [(3, 1)]
    lm.release(11)  # 12 moves down into its slot
    assert lm.passes([(10, 1), (12, 1)]) == [(2, 1)]
    assert lm.passes([(10, 1), (12, 1), (13, 1)]) == [(3, 1)]  # 13 would take the free slot
    lm.forward([(13, [1, 2])], last_only=True)
    assert lm.passes([(12, 3), (10, 1), (13, 1)]) == [(3, 1), (1, 2)]
    lm.close()


def model() -> CostModel:
    return CostModel(CostCurve({1: 10.0, 2: 14.0, 4: 20.0, 8: 30.0}), overhead_ms=0.0)


def test_the_curve_interpolates_and_grows_in_proportion_past_its_last_measurement():
    c = model().target
    assert c(3) == 17.0 and c(0) == 10.0
    assert c(32) == 120.0  # 30 ms at 8 tokens, 4x the tokens (not the flat tail of a bumpy curve)
    assert model().call_ms([(4, 16)]) == 240.0  # an unseen pass of 64 tokens


def test_a_call_costs_the_sum_of_its_passes():
    m = model()
    assert m.call_ms([(1, 2)]) == 14.0
    assert m.call_ms([(4, 1)]) == 20.0  # not seen yet: the curve at the pass's total tokens
    m.batched[(4, 1)] = 12.0
    assert m.call_ms([(4, 1), (1, 4)]) == 32.0


def test_observed_calls_are_shared_out_among_their_passes():
    m = model()
    m.observe_verify([(4, 1)], 16.0)
    assert m.batched[(4, 1)] == 16.0  # first sight: taken as is
    m.observe_verify([(4, 1), (1, 4)], 72.0)  # expected 16 + 20: both twice as slow
    assert m.batched[(4, 1)] == pytest.approx(0.9 * 16.0 + 0.1 * 32.0)
    assert m.target.ms[4] == pytest.approx(0.9 * 20.0 + 0.1 * 40.0)
    assert m.target.ms[1] == 10.0  # passes of one sequence are the curve, untouched here


def test_batched_costs_survive_a_save(tmp_path):
    m = model()
    m.observe_verify([(2, 3)], 25.0)
    m.save(tmp_path / "c.json")
    back = CostModel.load(tmp_path / "c.json")
    assert back is not None and back.batched == {(2, 3): 25.0}
    assert back.target.ms == m.target.ms


def test_interleaved_curves_take_turns_and_a_drifting_machine_falls_on_both(monkeypatch):
    """Two LMs of the same cost on a machine slowing down call by call: measured interleaved
    (each size on both in turn, who goes first alternating), their curves agree; the
    calibration sequences are gone after."""
    import time

    from specwise.backends.base import Reserved
    from specwise.backends.curves import measure_curves

    clock = {"now": 0.0, "calls": 0}
    order: list[tuple[str, int]] = []

    class Timed(ToyLM):
        def __init__(self, name):
            super().__init__(context_length=64)
            self.name = name

        def forward(self, batch, last_only=False, rows=None, trees=None):
            n = sum(len(t) for _, t in batch)
            clock["calls"] += 1
            clock["now"] += n * 0.010 * (1 + 0.05 * clock["calls"])  # 5% slower every call
            order.append((self.name, n))
            return super().forward(batch, last_only, rows, trees)

    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])
    lms = {"a": Timed("a"), "b": Timed("b")}
    curves = measure_curves(lms, sizes=[1, 4], repeats=3, context=32, plain_repeats=4)
    timed = order[4:]  # after each LM's prefill and warm-up
    assert [name for name, n in timed if n == 1] == list("abbaabbaabbaab")
    assert [name for name, n in timed if n == 4] == list("abbaab")
    for n in (1, 4):
        assert curves["a"].ms[n] == pytest.approx(curves["b"].ms[n], rel=0.06)
    assert all(lm.length(Reserved.CALIBRATION) == 0 for lm in lms.values())


def test_a_curve_measured_while_other_processes_took_the_cpu_is_not_trusted(monkeypatch):
    """The kernel's count of CPU time (busy, this process's own) says what others took while a
    curve was measured, as a share of the machine (2 cores here) less TICKS_S: a curve measured
    beside a job taking a core is consistent, flattened, and not kept."""
    import os
    import time

    from specwise.backends import curves

    clock = {"now": 0.0, "busy": 500.0, "own": 20.0, "others": 0.0}

    class Loaded(ToyLM):
        def forward(self, batch, last_only=False, rows=None, trees=None):
            clock["now"] += 0.010  # 10 ms a call...
            clock["own"] += 0.020  # ...on both cores
            clock["busy"] += 0.020 + clock["others"]
            return super().forward(batch, last_only, rows, trees)

    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(curves, "_cpu_seconds", lambda: (clock["busy"], clock["own"]))
    quiet = curves.measure_curve(Loaded(context_length=64), sizes=[1, 2], repeats=10, context=8)
    assert quiet.others == 0.0 and quiet.trusted()
    clock["others"] = 0.010  # another process takes one core: half the machine
    loaded = curves.measure_curve(Loaded(context_length=64), sizes=[1, 2], repeats=10, context=8)
    assert loaded.others == pytest.approx((20 * 0.010 - curves.TICKS_S) / (20 * 0.010 * 2))
    assert loaded.consistent() and not loaded.calm() and not loaded.trusted()
    clock["others"] = 0.001  # a tenth of a core for 0.2 s: under TICKS_S, not counted
    assert curves.measure_curve(Loaded(context_length=64), sizes=[1], repeats=20, context=8).calm()
    monkeypatch.setattr(curves, "_cpu_seconds", lambda: None)  # no /proc/stat: nothing known
    assert curves.Others().share() == 0.0


def test_drafters_running_one_model_are_measured_once(tmp_path, monkeypatch):
    """model and model-text run the same draft model: one measurement serves both."""
    from specwise import costs
    from specwise.drafters import make_drafters
    from toy import cross_pair

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(costs, "measure_curve", lambda lm, sizes: CostCurve({1: 10.0}))
    target, draft = cross_pair()
    drafters = make_drafters(["model", "model-text"], draft)
    calls: list[str] = []
    for d in drafters:
        monkeypatch.setattr(d, "measure_cost", lambda n=d.name: calls.append(n) or (2.0, 0.5))
    model = costs.measure_costs(target, drafters)
    assert calls == ["model"]
    assert model.catch_up_ms_per_token == {"model": 0.5, "model-text": 0.5}


def test_sizes_not_seen_since_the_curve_was_measured_move_with_the_plain_step():
    """A curve measured while the machine was three times slower: the plain rounds run set
    its level again, so drafts are priced at today's speed before any has run."""
    c = CostCurve({1: 90.0, 2: 99.0, 4: 150.0})
    for _ in range(200):
        c.observe(1, 30.0)
    assert c(1) == pytest.approx(30.0, rel=1e-3)
    assert c(2) == pytest.approx(33.0, rel=1e-3) and c(4) == pytest.approx(50.0, rel=1e-3)
    c.observe(4, 80.0)  # seen now: it learns from its own calls only
    c.observe(1, 15.0)
    assert c(4) == pytest.approx(0.9 * 50.0 + 0.1 * 80.0)
    assert c(2) == pytest.approx(33.0 * c(1) / 30.0, rel=1e-6)


def test_sizes_not_seen_follow_the_nearest_size_seen_below_them():
    """A curve whose shape was measured wrong (2 tokens at 1.29x a plain step, where the calls
    run cost 1.5x): once 2-token calls are seen, 3 and 4 tokens keep the measured shape from 2,
    not from 1; a size below every size seen stays as measured."""
    c = CostCurve({1: 31.3, 2: 40.4, 3: 47.9, 4: 53.8})
    for _ in range(300):
        c.observe(1, 24.0)
        c.observe(2, 36.0)
    assert c(1) == pytest.approx(24.0, rel=1e-6) and c(2) == pytest.approx(36.0, rel=1e-6)
    assert c(3) == pytest.approx(47.9 * 36.0 / 40.4, rel=1e-6)
    assert c(4) == pytest.approx(53.8 * 36.0 / 40.4, rel=1e-6)
    c.observe(3, 50.0)  # seen now: 4 follows 3
    assert c(4) == pytest.approx(53.8 * c(3) / 47.9, rel=1e-6)
    only_four = CostCurve({1: 10.0, 2: 12.0, 4: 20.0, 5: 25.0})
    only_four.observe(4, 40.0)  # nothing seen below 1 and 2: as measured; 5 follows 4
    assert only_four(1) == 10.0 and only_four(2) == 12.0 and only_four(4) == 22.0
    assert only_four(5) == pytest.approx(25.0 * 22.0 / 20.0)
    only_four.observe(9, 90.0)  # a size never measured: learnt, anchoring nothing
    assert only_four(9) == 90.0 and only_four(5) == pytest.approx(25.0 * 22.0 / 20.0)


def test_a_curve_measured_under_load_is_measured_again_and_never_cached(tmp_path, monkeypatch):
    """Not `trusted`: contradicting itself, or measured while others took the CPU."""
    from specwise import costs
    from specwise.backends.curves import TRIES
    from specwise.drafters import make_drafters

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    busy = CostCurve({1: 94.9, 2: 186.5, 4: 200.0, 5: 411.9, 6: 169.7})  # measured under load
    calm = CostCurve({1: 29.3, 2: 32.0, 4: 55.4, 8: 81.7})
    assert not busy.consistent() and calm.consistent()
    assert CostCurve({1: 0.05, 2: 0.01, 3: 0.3}).consistent()  # timer noise on a toy model
    # mainline's real curve, cached on the Zen 5 machine: its 16-token kernel is cheaper
    switch = {1: 36.0, 8: 148.0, 14: 254.0, 15: 231.0, 16: 183.0}
    assert CostCurve(switch).consistent()
    loaded = CostCurve({1: 31.3, 2: 40.4, 4: 53.8}, others=0.3)  # flattened, consistent
    target = ToyLM(vocab=12, seed=1)
    drafters = make_drafters(["ngram"], None)
    path = tmp_path / "costs" / f"{costs.target_key(target)}.json"
    measured = iter([busy, loaded, calm])
    monkeypatch.setattr(costs, "measure_curve", lambda lm, sizes: next(measured))
    assert costs.calibrated(target, drafters).target.ms == calm.ms  # the third try
    assert CostModel.load(path).target.ms == calm.ms
    CostModel(busy, {"ngram": 0.0}, catch_up_ms_per_token={"ngram": 0.0}).save(path)
    measured = iter([busy] * TRIES)
    assert costs.calibrated(target, drafters).target.ms == busy.ms  # used, this once
    assert CostModel.load(path).target.ms == busy.ms  # nothing saved: still the bad one...
    measured = iter([calm])
    assert costs.calibrated(target, drafters).target.ms == calm.ms  # ...so it is measured again


def test_every_set_of_drafters_prices_the_target_with_one_curve(tmp_path, monkeypatch):
    """The target's calls are measured once for all sets of drafters (each set measured
    at its own time would price the same call differently, for good), each drafter's cost
    once by what it runs; what is missing is measured, nothing else."""
    from specwise import costs
    from specwise.drafters import make_drafters

    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    curves = iter([CostCurve({1: 10.0, 2: 11.0}), CostCurve({1: 30.0, 2: 60.0})])
    monkeypatch.setattr(costs, "measure_curve", lambda lm, sizes: next(curves))
    measured: list[str] = []

    def drafters(names):
        ds = make_drafters(names, None)
        for d in ds:
            monkeypatch.setattr(
                d, "measure_cost", lambda n=d.name: measured.append(n) or (0.1, 0.0)
            )
        return ds

    target = ToyLM(vocab=12, seed=1)
    one = costs.calibrated(target, drafters(["ngram"]))
    two = costs.calibrated(target, drafters(["ngram", "suffix"]))
    assert one.target.ms == two.target.ms == {1: 10.0, 2: 11.0}
    assert measured == ["ngram", "suffix"]
    assert two.draft_ms_per_token == {"ngram": 0.1, "suffix": 0.1}
    assert sorted(p.name for p in (tmp_path / "costs").iterdir()) == sorted(
        [f"{costs.target_key(target)}.json", f"drafters-{costs._key([costs.machine()])}.json"]
    )
    two.target.observe(1, 50.0)  # a controller's copy learns alone
    assert costs.calibrated(target, drafters(["suffix"])).target.ms == {1: 10.0, 2: 11.0}
