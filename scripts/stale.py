"""Is an aligned step priced as it then costs? Replays the cost model's EMA (0.1 a call) over
the trace's steps of B sequences by auto, in the order run: before each aligned step (every
sequence 1 + n tokens), the price of its shape over the price of a plain step then, against the
same ratio measured (its verify time over the median of the 20 plain steps around it). With
"ratio", each shape is priced as a learnt ratio to the plain step instead.

Usage: python scripts/stale.py rounds.jsonl B [ratio]
"""

import statistics
import sys

from _trace import fed, setting, steps

B, as_ratio = int(sys.argv[2]), sys.argv[3:] == ["ratio"]
seq = [s for s in steps(sys.argv[1]) if s[0]["batch_size"] == B and setting(s) == "auto"]
verify = [s[0]["verify_ms"] for s in seq]
shapes = [max(1 + fed(r) for r in s) for s in seq]


def blend(old, x):
    return x if old is None else 0.9 * old + 0.1 * x


price, out = {}, []  # shape -> ms (or ratio to the plain step's price)
plain_idx = [i for i, n in enumerate(shapes) if n == 1]
for i, (n, v) in enumerate(zip(shapes, verify, strict=True)):
    if n > 1 and n in price and 1 in price:
        near = sorted(plain_idx, key=lambda j: abs(j - i))[:20]
        local = statistics.median(verify[j] for j in near)
        planned = price[n] if as_ratio else price[n] / price[1]
        out.append(planned / (v / local))
    if n == 1 or not as_ratio:
        price[n] = blend(price.get(n), v)
    elif 1 in price:
        price[n] = blend(price.get(n), v / price[1])
if out:
    print(
        f"{len(out)} aligned steps of {B}: planned / measured price, median"
        f" {statistics.median(out):.2f}, mean {statistics.mean(out):.2f}"
    )
else:
    print(f"no aligned step of {B} after both shapes were priced")
