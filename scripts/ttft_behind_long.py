"""TTFT of short chat requests alone, and behind long prompts: is a short request held behind a
long one's prefill? (Any OpenAI-compatible server.) Two experiments:

- default: a short request one second after a long prompt was sent (medians over --trials);
  compare `specwise serve --prefill-chunk 64` with `--prefill-chunk 0`;
- `--in-flight N --every S --seconds T`: N clients send short requests back to back (each
  the next of a list of short questions, --max-tokens tokens) for T seconds while one long
  prompt arrives every S seconds; TTFT p50/p90 of the short requests against the same
  questions' TTFT alone (each sent once on the idle server first). The server needs at least
  N + 2 slots (`specwise serve --max-batch`), else short requests queue for a slot; a
  long prompt the server cannot take in before the next arrives queues behind it.

Usage: python scripts/ttft_behind_long.py --url http://127.0.0.1:8000 [--long-words 1500]
       python scripts/ttft_behind_long.py --url URL --in-flight 8 --every 30 --seconds 300
"""

import argparse
import itertools
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from specwise.bench.load import LoadOptions, one_request, server_client

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--url", required=True)
p.add_argument("--long-words", type=int, default=1500, help="words of the long prompt (1500)")
p.add_argument("--after", type=float, default=1.0, help="seconds between the two (1)")
p.add_argument("--trials", type=int, default=3)
p.add_argument("--in-flight", type=int, help="short requests in flight (the load experiment)")
p.add_argument("--every", type=float, default=30.0, help="seconds between long prompts (30)")
p.add_argument("--seconds", type=float, default=300.0, help="length of the load run (300)")
p.add_argument("--max-tokens", type=int, default=8, help="tokens of each answer (8)")
a = p.parse_args()
opts = LoadOptions({"": a.url}, [1], [], [None], Path("."), max_tokens=a.max_tokens)
SHORT = "Explain what a mutex is in one sentence."
QUESTIONS = [
    SHORT,
    "What does HTTP status 404 mean?",
    "Name three uses of a hash map.",
    "Why is the sky blue? One sentence.",
    "What is a Python generator?",
    "Give a synonym for 'quick'.",
    "What does SQL's GROUP BY do?",
    "How many bits are in a byte?",
    "What is recursion, briefly?",
    "Define latency in one sentence.",
    "What is the capital of Canada?",
    "What is a unit test?",
]
WORDS = "the river carried small boats past old mills while people on the bank talked about"


def ttft(content: str, out: dict, key) -> None:
    with server_client(a.url, opts) as client:
        r = one_request(client, opts, content, None)
    if "error" in r:
        raise SystemExit(f"the request failed: {r['error']}")
    out[key] = r["ttft_s"]


words = WORDS.split()
long = "Summarize this text. " + " ".join(words[i % len(words)] for i in range(a.long_words))


def behind_one() -> None:
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


def under_load() -> None:
    alone: dict = {}
    for i, q in enumerate(QUESTIONS):
        ttft(q, alone, i)
    start = time.monotonic()
    end = start + a.seconds
    shorts: list[float] = []
    longs: dict = {}
    lock = threading.Lock()
    order = itertools.cycle(range(len(QUESTIONS)))

    def client() -> None:
        while time.monotonic() < end:
            with lock:
                i = next(order)
            got: dict = {}
            ttft(QUESTIONS[i], got, "t")
            with lock:
                shorts.append(got["t"])

    def arrivals() -> None:
        sent = []
        n = 0
        while time.monotonic() < end:
            t = threading.Thread(target=ttft, args=(long, longs, n), daemon=True)
            t.start()
            sent.append(t)
            n += 1
            time.sleep(max(0.0, start + n * a.every - time.monotonic()))
        for t in sent:
            t.join()

    threads = [threading.Thread(target=client) for _ in range(a.in_flight)]
    threads.append(threading.Thread(target=arrivals))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    base = statistics.median(alone.values())
    p50, p90 = np.percentile(shorts, [50, 90])
    print(
        f"short requests alone: TTFT p50 {base:.2f} s ({len(alone)} questions); with "
        f"{a.in_flight} in flight and a {a.long_words}-word prompt every {a.every:g} s for "
        f"{a.seconds:g} s: TTFT p50 {p50:.2f} s ({p50 / base:.2f}x alone), p90 {p90:.2f} s, "
        f"{len(shorts)} requests; the long prompts' TTFT: "
        + ", ".join(f"{v:.1f} s" for _, v in sorted(longs.items()))
        + f" ({len(longs)} of them answered)"
    )


if a.in_flight:
    under_load()
else:
    behind_one()
