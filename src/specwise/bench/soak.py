"""A soak (`specwise bench load --soak`): one level of load kept busy for a given time against
any OpenAI-compatible server, its /health sampled as it goes (does its memory stay bounded?);
beside the load, a fault of `bench.faults` every so many seconds where asked, and once the soak
is over, its greedy answers checked against the same requests alone (`bench.ties`). Then the
soak's checks (`soak_checks`: no 5xx, every request of the load answered, every fault taken as
required, nothing left running or holding cache once idle, resident memory flat after the
first quarter, greedy answers as alone but at near-ties), each PASS or FAIL, and the verdict.

It sends its requests as `bench.load` does (`one_request`, `server_client`). What it is not: a
throughput measurement (no levels, none of `bench.load_stats`' statistics), nor a server's
keeper: it starts and stops none (`scripts/soak.py`, `make soak`, does, and checks the drain on
SIGTERM).
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import httpx

from specwise.bench import faults as catalogue  # `faults` names a soak's outcomes
from specwise.bench.load import LoadOptions, one_request, server_client
from specwise.bench.load_stats import fmt
from specwise.bench.ties import NEAR_TIE_FACTOR, alone_check, near_ties

__all__ = ["run_soak", "soak_checks", "soak_table", "soak_verdict"]


def _health(client: httpx.Client) -> dict[str, float]:
    """The numbers the server's /health reports now (none where it has no /health)."""
    try:
        r = client.get("/health")
        body = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        body = {}
    return {
        key: v for key, v in body.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def soak_table(samples: list[dict]) -> list[str]:
    """A markdown table of a soak's samples: time, requests so far, and /health's numbers."""
    fields = list(dict.fromkeys(key for s in samples for key in s["health"]))
    out = [
        "| minutes | answered | failed | " + " | ".join(fields) + " |",
        "|---" * (3 + len(fields)) + "|",
    ]
    for s in samples:
        values = [fmt(s["health"].get(key), "g") for key in fields]
        out.append(
            f"| {s['seconds'] / 60:.1f} | {s['answered']} | {s['failed']} | "
            + " | ".join(values)
            + " |"
        )
    return out


ALONE_PROMPTS = 12  # prompts whose soak answers are checked against the prompt alone
RETRY_AFTER_S = 1.0  # a soak worker's wait after a 429 (specwise's Retry-After)
# a fault that must be answered waits this many times the longest of the load's RECENT latencies
PATIENCE_FACTOR, RECENT = 1.5, 32


def run_soak(
    opts: LoadOptions,
    seconds: float,
    every: float,
    stream=None,
    fault_every: float | None = None,
    alone: bool = False,
) -> dict:
    """Load without pause for `seconds`: `opts.concurrency[0]` workers each send the next
    prompt (wrapping round) as soon as their last request ends, with the first setting (the
    first server, `opts.ks[0]`).
    Every `every` seconds, and once more when the last request has ended, a sample: the time,
    the requests answered and failed so far, and the numbers the server's /health reports
    (a specwise server: its resident memory, the sequences holding cache, the size of the
    suffix drafter's memory).
    fault_every: also one fault of `bench.faults` (picked at random, seeded) every so many
    seconds, beside the load; one that must be answered waits PATIENCE_FACTOR x the longest
    latency of the load's last RECENT requests (at least `faults.REQUEST_S`), since it queues
    behind them; so the first fault waits until as many answers as workers have come (the
    first answers of a server with fewer slots than workers never queued, and a patience
    scaled from them alone timed the first faults out). alone: once the soak is over, run
    each of the first ALONE_PROMPTS prompts alone (the server idle) and compare the soak's greedy answers to
    them with it (`alone_check`, `near_ties`; answers carry their log-probabilities).
    Returns the soak's result: the samples, the faults' outcomes, and `checks`, each criterion
    with what was measured and whether it passed: no 5xx, every fault taken as required,
    nothing left running or holding cache once idle, resident memory grown < 5% after the
    first quarter, greedy answers as alone but at near-ties. Requests go to requests.jsonl,
    the result to soak.json and soak.md."""
    from tqdm import tqdm

    stream = stream or sys.stdout
    opts.out.mkdir(parents=True, exist_ok=True)
    opts.logprobs = opts.logprobs or alone
    workers, setting = opts.concurrency[0], opts.settings()[0]
    picks = itertools.count()
    counts = {"answered": 0, "failed": 0}
    lock = threading.Lock()
    errors: dict[str, int] = {}
    checks: list[dict] = []
    faults: list[dict] = []
    answers: dict[int, list[list[dict]]] = {}  # prompt -> its greedy answers' entries
    recent: collections.deque[float] = collections.deque(maxlen=RECENT)  # latencies, seconds
    t0 = time.perf_counter()
    done = threading.Event()

    def work(client: httpx.Client, log) -> None:
        while time.perf_counter() - t0 < seconds:
            p = next(picks) % len(opts.prompts)
            r = one_request(client, opts, opts.prompts[p], setting.k)
            r.pop("progress", None)
            got = r.pop("logprobs", None)
            with lock:
                counts["failed" if "error" in r else "answered"] += 1
                if "error" not in r:
                    recent.append(r["latency_s"])
                if "error" in r:
                    errors[r["error"]] = errors.get(r["error"], 0) + 1
                elif alone and p < ALONE_PROMPTS and got is not None:
                    answers.setdefault(p, []).append(got)
                row = {"prompt": p, "k": setting.k, **r}
                log.write(json.dumps(row, separators=(",", ":")) + "\n")
                log.flush()
            if r.get("error") == "HTTP 429":  # the server is full: retry after a while, as told
                time.sleep(RETRY_AFTER_S)

    def inject() -> None:
        rng = random.Random(opts.seed)
        n = 1
        while counts["answered"] < workers and not counts["failed"] and not done.wait(0.5):
            pass  # no fault before an answer that queued (see the docstring)
        while not done.wait(max(0.0, t0 + n * fault_every - time.perf_counter())):
            with lock:  # a fault's request waits in the same queue as the load's requests
                patience = max(catalogue.REQUEST_S, PATIENCE_FACTOR * max(recent, default=0.0))
            name = rng.choice(list(catalogue.FAULTS))
            got = catalogue.run_faults(setting.url, opts.api_key, [name], rng, patience_s=patience)
            with lock:
                faults.append({"at_s": time.perf_counter() - t0, "patience_s": patience, **got[0]})
            n = max(n + 1, math.ceil((time.perf_counter() - t0) / fault_every))

    samples: list[dict] = []

    def sample(root: httpx.Client) -> None:
        with lock:
            row = {"seconds": time.perf_counter() - t0, **counts, "faults": len(faults)}
        samples.append({**row, "health": _health(root)})

    with (
        server_client(setting.url, opts) as client,
        server_client(setting.url, opts, api=False) as root,
        (opts.out / "requests.jsonl").open("w") as log,
        ThreadPoolExecutor(workers + 1) as pool,
        tqdm(total=round(seconds), desc="soak", unit="s", file=sys.stderr) as bar,
    ):
        futures = [pool.submit(work, client, log) for _ in range(workers)]
        injector = pool.submit(inject) if fault_every else None
        sample(root)
        while not all(f.done() for f in futures):
            wait(futures, max(0.0, samples[-1]["seconds"] + every - (time.perf_counter() - t0)))
            sample(root)
            bar.n = min(round(samples[-1]["seconds"]), bar.total)
            bar.set_postfix_str(
                f"{counts['answered']} answered, {counts['failed']} failed, {len(faults)} faults"
            )
        done.set()
        for f in [*futures, *([injector] if injector else [])]:
            f.result()
        if fault_every:  # the last fault may have left work behind: a sample once idle
            _settle(root)
            sample(root)
        for p in tqdm(sorted(answers), desc="alone", unit="prompt", file=sys.stderr):
            ref = one_request(client, opts, opts.prompts[p], setting.k)  # on an idle server
            if "error" not in ref:
                checks += [alone_check(ref["logprobs"], got) for got in answers[p]]
    result = {
        "command": "specwise " + " ".join(sys.argv[1:]),
        "url": setting.url,
        "concurrency": workers,
        "k": setting.k,
        "seconds": seconds,
        "samples": samples,
        "errors": errors,
        "faults": faults,
        "alone": near_ties(checks, NEAR_TIE_FACTOR) if alone else None,
    }
    result["checks"] = soak_checks(result)
    lines = [*soak_table(samples), "", *soak_verdict(result)]
    (opts.out / "soak.json").write_text(json.dumps(result, indent=1))
    (opts.out / "soak.md").write_text(
        f"# specwise soak\n\nCommand: `{result['command']}`\n\n" + "\n".join(lines) + "\n"
    )
    print("\n".join(lines), file=stream)
    print(f"\nreport: {opts.out / 'soak.md'}", file=stream)
    return result


def _settle(root: httpx.Client, timeout_s: float = 15.0) -> None:
    """Wait (up to timeout_s) until /health says nothing is running, prefilling or queued."""
    end = time.perf_counter() + timeout_s
    while time.perf_counter() < end:
        h = _health(root)
        if not any(h.get(key) for key in ("running", "prefilling", "queued")):
            return
        time.sleep(0.2)


def soak_checks(result: dict) -> list[dict]:
    """Each criterion of a soak, what was measured and whether it passed (module docstring of
    `run_soak`); a criterion the server or the run gave nothing to judge by is left out."""
    out = []

    def check(name: str, measured: str, ok: bool) -> None:
        out.append({"check": name, "measured": measured, "ok": ok})

    five = {e: n for e, n in result["errors"].items() if e.startswith("HTTP 5")}
    five_faults = [f for f in result["faults"] if (f.get("status") or 0) >= 500]
    check(
        "no 5xx",
        f"{sum(five.values())} requests and {len(five_faults)} faults answered 5xx",
        not five and not five_faults,
    )
    lost = {e: n for e, n in result["errors"].items() if e != "HTTP 429" and e not in five}
    check(
        "every request of the load answered (429s aside: the queue was full)",
        f"{sum(lost.values())} not answered"
        + (f" ({', '.join(f'{n} {e}' for e, n in lost.items())})" if lost else ""),
        not lost,
    )
    if result["faults"]:
        bad = [f"{f['fault']}: {f['detail']}" for f in result["faults"] if not f["ok"]]
        check(
            "every fault taken as required",
            f"{len(result['faults']) - len(bad)} of {len(result['faults'])}"
            + (f" (not: {'; '.join(bad[:3])})" if bad else ""),
            not bad,
        )
    last = result["samples"][-1]["health"]
    check("the server answers /health at the end", "yes" if last else "no", bool(last))
    idle = {
        key: last[key] for key in ("running", "prefilling", "queued", "sequences") if key in last
    }
    if idle:
        measured = ", ".join(f"{key} {v:g}" for key, v in idle.items())
        check("nothing left running or holding cache", measured, not any(idle.values()))
    rss = [
        (s["seconds"], s["health"]["rss_mb"]) for s in result["samples"] if "rss_mb" in s["health"]
    ]
    after = [mb for t, mb in rss if t >= result["seconds"] / 4]
    if len(after) >= 2:
        growth = after[-1] / after[0] - 1
        check(
            "resident memory grows < 5% after the first quarter",
            f"{100 * growth:+.1f}%",
            growth < 0.05,
        )
    if result["alone"] is not None:
        a = result["alone"]
        check(
            "greedy answers as alone, or parted at near-ties",
            f"{a['matched']} of {a['answers']} as alone; {a['diverged']} parted, "
            f"{a['at_near_ties']} at near-ties (top-2 gap <= {a['factor']:g} x noise "
            f"{a['noise']:.3g})",
            a["answers"] > 0 and a["at_near_ties"] == a["diverged"],
        )
    return out


def soak_verdict(result: dict) -> list[str]:
    """The soak's checks for people, one line each, and the overall verdict."""
    lines = [
        f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}: {c['measured']}" for c in result["checks"]
    ]
    ok = all(c["ok"] for c in result["checks"])
    return [*lines, f"soak: {'passed' if ok else 'FAILED'}"]
