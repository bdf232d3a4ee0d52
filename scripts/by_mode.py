"""Step time and tokens by setting (auto / off) and batch size, from a server trace.

Usage: python scripts/by_mode.py rounds.jsonl
"""

import sys
from collections import defaultdict

from _trace import setting, step_ms, steps

agg = defaultdict(lambda: [0, 0.0, 0])  # (setting, batch size) -> steps, ms, tokens emitted
for s in steps(sys.argv[1]):
    a = agg[(setting(s), s[0]["batch_size"])]
    a[0], a[1], a[2] = a[0] + 1, a[1] + step_ms(s), a[2] + sum(r["emitted"] for r in s)
for (mode, b), (n, ms, em) in sorted(agg.items()):
    print(f"{mode} batch {b}: {n} steps, {ms / 1000:.1f} s, {em} tokens, {ms / em:.1f} ms a token")
