"""By batch size, the steps auto planned and those it left plain because planning had backed
off, and what proposing and planning cost a step, by setting (a server trace).

Usage: python scripts/planning.py rounds.jsonl
"""

import sys
from collections import defaultdict

from _trace import setting, steps

agg = defaultdict(lambda: [0, 0, 0, 0.0, 0.0])  # b -> auto steps, unplanned, off steps, ms x2
for s in steps(sys.argv[1]):
    b = s[0]["batch_size"]
    if len(s) != b:
        continue
    a = agg[b]
    if setting(s) == "off":
        a[2] += 1
        a[4] += s[0]["draft_ms"]
    elif setting(s) == "auto":
        a[0] += 1
        a[3] += s[0]["draft_ms"]
        a[1] += all(r["decision"].startswith("plain: in batches") for r in s)
for b, (n, u, o, ma, mo) in sorted(agg.items()):
    print(
        f"batch {b}: auto {n} steps, {u} not planned; planning+drafting mean "
        f"{ma / max(n, 1):.3f} ms a step against off's {mo / max(o, 1):.3f} ({o} steps)"
    )
