"""TTFT of a short chat request alone, and when it arrives one second after a long prompt
started its prefill: is the short request held behind the long one? (Any OpenAI-compatible
server; compare `specwise serve --prefill-chunk 64` with `--prefill-chunk 0`.) Medians over
--trials.

Usage: python scripts/ttft_behind_long.py --url http://127.0.0.1:8000 [--long-words 1500]
"""

import argparse
import statistics
import threading
import time
from pathlib import Path

from specwise.bench.load import LoadOptions, one_request, server_client

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--url", required=True)
p.add_argument("--long-words", type=int, default=1500, help="words of the long prompt (1500)")
p.add_argument("--after", type=float, default=1.0, help="seconds between the two (1)")
p.add_argument("--trials", type=int, default=3)
a = p.parse_args()
opts = LoadOptions({"": a.url}, [1], [], [None], Path("."), max_tokens=8)
SHORT = "Explain what a mutex is in one sentence."
WORDS = "the river carried small boats past old mills while people on the bank talked about"


def ttft(content: str, out: dict, key: str) -> None:
    with server_client(a.url, opts) as client:
        r = one_request(client, opts, content, None)
    if "error" in r:
        raise SystemExit(f"the request failed: {r['error']}")
    out[key] = r["ttft_s"]


words = WORDS.split()
long = "Summarize this text. " + " ".join(words[i % len(words)] for i in range(a.long_words))
alone, behind, long_ttft = [], [], []
for _ in range(a.trials):
    got: dict = {}
    ttft(SHORT, got, "alone")
    alone.append(got["alone"])
    first = threading.Thread(target=ttft, args=(long, got, "long"))
    first.start()
    time.sleep(a.after)
    ttft(SHORT, got, "behind")
    first.join()
    behind.append(got["behind"])
    long_ttft.append(got["long"])
ratio = statistics.median(behind) / statistics.median(alone)
print(
    f"short alone {statistics.median(alone):.2f} s, behind a {a.long_words}-word prompt "
    f"{statistics.median(behind):.2f} s ({ratio:.1f}x); the long prompt's own TTFT "
    f"{statistics.median(long_ttft):.2f} s (medians of {a.trials})"
)
