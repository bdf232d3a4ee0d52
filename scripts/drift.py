"""Median verify time of off's and auto's plain steps of B sequences, in chunks of N
consecutive steps in the order the server ran them: how the machine drifted.

Usage: python scripts/drift.py rounds.jsonl [N=400] [B=4]
"""

import statistics
import sys

from _trace import fed, setting, steps

n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
b = int(sys.argv[3]) if len(sys.argv) > 3 else 4
chunk = [
    (setting(s), s[0]["verify_ms"])
    for s in steps(sys.argv[1])
    if s[0]["batch_size"] == b and not any(fed(r) for r in s)
]
for i in range(0, len(chunk), n):
    c = chunk[i : i + n]
    print(i // n, c[0][0], c[-1][0], len(c), round(statistics.median(x for _, x in c), 1))
