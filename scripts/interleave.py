"""Do aligned steps (4 x 2 tokens, rolled back) slow the plain steps (4 x 1) around them?
Alternating blocks of 30 plain steps: 'off' blocks only plain; 'auto' blocks with an aligned
step after every 15th. Median plain-step ms per block; sequences grow as in decoding.

Usage: python scripts/interleave.py [--model qwen2.5-coder-1.5b-instruct] [--blocks 16]
"""

import statistics
import time

from _model import prefilled

a, lm, rng = prefilled(__doc__, 4, "--blocks", 16)
res = {"off": [], "auto": []}
for block in range(a.blocks):
    mode = "off" if block % 2 == 0 else "auto"
    ms = []
    for i in range(30):
        t = time.perf_counter()
        lm.forward([(q, [int(rng.integers(10, 1000))]) for q in range(4)])
        ms.append((time.perf_counter() - t) * 1000)
        if mode == "auto" and i % 15 == 14:
            n = {q: lm.length(q) for q in range(4)}
            lm.forward([(q, [5, 6]) for q in range(4)])
            for q in range(4):
                lm.truncate(q, n[q])
    res[mode].append(statistics.median(ms[1:]))
    print(block, mode, round(res[mode][-1], 1), flush=True)
print({m: round(statistics.median(v), 1) for m, v in res.items() if v})
