"""The batch size of every step of a server trace, run-length coded, and the step time by
batch size, for each stretch of one setting.

Usage: python scripts/seqb.py rounds.jsonl
"""

import collections
import sys

from _trace import setting, step_ms, steps

stretches = []  # (setting, [(batch size, ms)])
for s in steps(sys.argv[1]):
    mode = setting(s)
    if not stretches or stretches[-1][0] != mode:
        stretches.append((mode, []))
    stretches[-1][1].append((s[0]["batch_size"], step_ms(s)))
for mode, bs in stretches:
    runs = []
    for b, _ in bs:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    ms = collections.Counter()
    for b, t in bs:
        ms[b] += t
    print(mode, len(bs), " ".join(f"{b}x{n}" for b, n in runs))
    print("   s by batch size:", {b: round(v / 1000, 1) for b, v in sorted(ms.items())})
