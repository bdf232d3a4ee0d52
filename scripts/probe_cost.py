"""Per request of auto in a bench run: how many rounds speculated, and what they saved, as a
share of the request's decode time (their emitted tokens priced at the request's median plain
round, less their time). Negative where speculating (probes included) did not pay.

Usage: python scripts/probe_cost.py BENCH_OUT/rounds.jsonl
"""

import statistics
import sys
from collections import defaultdict

from _trace import rows

by_request = defaultdict(list)
for r in rows(sys.argv[1]):
    if r["round"] and r["config"].startswith("auto"):
        by_request[(r["prompt_id"], r["config"])].append(r)
for (pid, cfg), rs in by_request.items():

    def ms(r):
        return r["draft_ms"] + r["verify_ms"] + r["overhead_ms"]

    plain = [ms(r) for r in rs if r["drafter"] is None]
    spec = [r for r in rs if r["drafter"] is not None]
    if not plain:
        print(pid, cfg, len(spec), "no plain round to price by")
        continue
    saved = sum(r["emitted"] for r in spec) * statistics.median(plain) - sum(ms(r) for r in spec)
    print(pid, cfg, len(spec), f"{100 * saved / sum(ms(r) for r in rs):+.1f}% saved")
