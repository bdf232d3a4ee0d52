"""A server trace's steps of B sequences, by setting and by whether anybody speculated:
verify time (median and mean), drafting and overhead (means), tokens a step, ms a token.

Usage: python scripts/by_kind.py rounds.jsonl B
"""

import statistics
import sys
from collections import defaultdict

from _trace import fed, setting, step_ms, steps

agg = defaultdict(list)
for s in steps(sys.argv[1]):
    if s[0]["batch_size"] == int(sys.argv[2]):
        kind = "spec" if any(fed(r) for r in s) else "plain"
        agg[(setting(s), kind)].append(s)
for (mode, kind), ss in sorted(agg.items()):
    ver = [s[0]["verify_ms"] for s in ss]
    em = sum(r["emitted"] for s in ss for r in s)
    print(
        mode,
        kind,
        len(ss),
        "verify med",
        round(statistics.median(ver), 1),
        "mean",
        round(statistics.mean(ver), 1),
        "draft mean",
        round(statistics.mean(s[0]["draft_ms"] for s in ss), 2),
        "overhead mean",
        round(statistics.mean(min(r["overhead_ms"] for r in s) for s in ss), 2),
        "tokens/step",
        round(em / len(ss), 2),
        "ms/token",
        round(sum(step_ms(s) for s in ss) / em, 1),
    )
