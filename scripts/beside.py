"""Steps in which exactly one request drafted m tokens beside a batch of plain sequences: such a
step costs a pass of its own. Its extra time over the median plain step of that batch size,
against the cost curve's price of 1 + m tokens alone (the costs file the server calibrated,
`$SPECWISE_HOME/costs/<key>.json`), and what those steps saved.

Usage: python scripts/beside.py rounds.jsonl costs.json
"""

import json
import statistics
import sys
from collections import defaultdict

from _trace import fed, step_ms, steps

with open(sys.argv[2]) as f:
    curve = {int(n): ms for n, ms in json.load(f)["target"].items()}
all_steps = steps(sys.argv[1])
plain = defaultdict(list)
for s in all_steps:
    if not any(fed(r) for r in s):
        plain[s[0]["batch_size"]].append(s[0]["verify_ms"])
extra, spent, saved = defaultdict(list), 0.0, 0.0
for s in all_steps:
    b, drafting = s[0]["batch_size"], [r for r in s if fed(r)]
    if b > 1 and len(drafting) == 1 and not drafting[0].get("padded") and plain[b]:
        p, m = statistics.median(plain[b]), drafting[0]["proposed"]
        extra[(b, m)].append((s[0]["verify_ms"] - p) / curve[min(m, max(curve))])
        spent += step_ms(s)
        saved += p * sum(r["emitted"] for r in s) / b - step_ms(s)
for (b, m), x in sorted(extra.items()):
    print(f"batch {b}, {m} drafted: {len(x)} steps, extra pass = {statistics.median(x):.2f}x curve")
print(f"these steps: {spent:.0f} ms, saved {saved:+.0f} ms ({saved / max(spent, 1):+.1%})")
