"""Replays the rule by which planning backs off (`specwise.controller.backoff.Backoff`, the
rule itself) over auto's steps of B sequences in a server trace, in the order run. A
speculative step saved P·N/B − T (P the median of the 20 plain steps around it, as in
`specwise bench steps`); planning costs what auto's steps of B spent proposing and planning over
what off's spent. A step the rule leaves unplanned decodes plainly: it saves nothing and costs
no planning. (A replay: a step left plain would have changed the steps after it.)

Usage: python scripts/backoff.py rounds.jsonl [B ...]   (default: 2 4 8)
"""

import statistics
import sys

from _trace import fed, setting, step_ms, steps

from specwise.controller.backoff import Backoff

all_steps = steps(sys.argv[1])
for B in map(int, sys.argv[2:] or ["2", "4", "8"]):
    full = [s for s in all_steps if len(s) == B == s[0]["batch_size"]]
    seq = [s for s in full if setting(s) == "auto"]
    off = [s[0]["draft_ms"] for s in full if setting(s) == "off"]
    if not seq or not off:
        print(f"batch {B}: the trace needs steps of both settings")
        continue
    ms = [step_ms(s) for s in seq]
    spec = [any(fed(r) for r in s) for s in seq]
    plain = [i for i, x in enumerate(spec) if not x]
    saved = []
    for i, s in enumerate(seq):
        if not spec[i] or not plain:
            saved.append(0.0)
            continue
        p = statistics.median(ms[j] for j in sorted(plain, key=lambda j: abs(j - i))[:20])
        saved.append(p * sum(r["emitted"] for r in s) / B - ms[i])
    cost = statistics.mean(s[0]["draft_ms"] for s in seq) - statistics.mean(off)
    rule, planned, kept = Backoff(), 0, 0.0
    for x in saved:
        if rule.skip(B) is not None:
            continue
        planned += 1
        kept += x
        rule.learn(B, x > 0)
    total = sum(ms)
    print(
        f"batch {B}: {len(seq)} steps, {sum(spec)} speculative; planning {cost:.2f} ms a step."
        f" Every step planned: saved {sum(saved) / total:+.2%}, planning"
        f" {cost * len(seq) / total:.2%}, net {(sum(saved) - cost * len(seq)) / total:+.2%}."
        f" Backing off: {planned} planned, saved {kept / total:+.2%}, planning"
        f" {cost * planned / total:.2%}, net {(kept - cost * planned) / total:+.2%}"
    )
