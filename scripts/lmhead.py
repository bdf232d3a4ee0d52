"""An aligned step with and without the logits of its filler: s sequences x 2 tokens, logits
for both rows or for the first only, against a plain step of s (medians of 7 calls).

Usage: python scripts/lmhead.py [--model qwen2.5-coder-1.5b-instruct] [--repeats 3]
"""

import statistics
import time

from _model import PREFIX, prefilled

a, lm, _ = prefilled(__doc__, 8, "--repeats", 3)


def run(s, n, rows=None):
    ts = []
    for _ in range(8):
        t = time.perf_counter()
        lm.forward([(q, [11, 12][:n]) for q in range(s)], rows=rows and [rows] * s)
        ts.append((time.perf_counter() - t) * 1000)
        for q in range(s):
            lm.truncate(q, PREFIX)
    return statistics.median(ts[1:])


for rep in range(a.repeats):
    for s in (2, 4, 8):
        plain, both, first = run(s, 1), run(s, 2), run(s, 2, rows=1)
        print(
            rep,
            s,
            f"plain {plain:.1f}, {s} x 2 all rows {both / plain:.2f}, first only {first / plain:.2f}",
        )
