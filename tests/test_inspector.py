"""The trace inspector's server side on the smallest real model: the page's files, step mode (one
round per step, settings per step, the same text as the API), the live list, keys and tenants.
The page in a real browser: test_ui.py."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time

import httpx
import pytest

from specwise.sampling import SamplingParams
from specwise.server.app import create_app
from specwise.server.metrics import Metrics
from specwise.server.scheduler import Job, Scheduler
from test_server import MODEL, make_engine, serving

KEYS = ("key-a", "key-b")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(smollm2_path):
    app = create_app(make_engine(smollm2_path), MODEL, max_batch=4, max_queue=8, api_keys=KEYS)
    with serving(app) as url:
        yield url


class Events:
    """A session's events stream, read on a thread into a queue."""

    def __init__(self, url: str, sid: str, key: str) -> None:
        self.q: queue.Queue = queue.Queue()
        self._client = httpx.Client(timeout=120)
        self._cm = self._client.stream(  # kept: collecting it would close the stream
            "GET", f"{url}/ui/api/sessions/{sid}/events", headers=auth(key)
        )
        self._resp = self._cm.__enter__()
        assert self._resp.status_code == 200
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._resp.iter_lines():
                if line.startswith("data: "):
                    self.q.put(json.loads(line[6:]))
        except (httpx.HTTPError, httpx.StreamClosed):
            pass

    def next(self, timeout: float = 120) -> dict:
        return self.q.get(timeout=timeout)

    def empty_for(self, seconds: float) -> bool:
        try:
            self.q.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self._client.close()


def test_the_page_and_its_files_are_served_without_a_key(server):
    page = httpx.get(f"{server}/ui")
    assert page.status_code == 200 and "inspector.js" in page.text
    js = httpx.get(f"{server}/ui/static/inspector.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert httpx.get(f"{server}/ui/static/..%2Fapp.py").status_code == 404


def test_data_needs_a_key(server):
    r = httpx.get(f"{server}/ui/api/info")
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    info = httpx.get(f"{server}/ui/api/info", headers=auth("key-a")).json()
    assert info["mode"] == "live" and info["model"] == MODEL
    assert info["drafters"] == ["ngram", "model"] and info["auto"] is True


VARIED = [{}, {}, {"k": 0}, {"drafter": "model", "k": 2}, {"k": "auto"}]


@pytest.mark.parametrize(
    ("temperature", "settings"),
    [(0.0, VARIED), (0.8, [{}] * 5)],  # a sample is the API's when the drafts are the same
    ids=["greedy, settings changed per step", "sampled"],
)
def test_step_mode_runs_one_round_per_step_and_ends_with_the_apis_text(
    server, temperature, settings
):
    body = {"prompt": "Count from one to ten: one, two,", "max_tokens": 24, "seed": 11}
    body["temperature"] = temperature
    want = httpx.post(
        f"{server}/v1/completions",
        json={**body, "speculative": {"k": 3, "drafter": "ngram"}},
        headers=auth("key-a"),
        timeout=120,
    ).json()["choices"][0]["text"]
    r = httpx.post(
        f"{server}/ui/api/sessions",
        json={**body, "k": 3, "drafter": "ngram", "paused": True},
        headers=auth("key-a"),
    )
    assert r.status_code == 200, r.text
    sid = r.json()["id"]
    events = Events(server, sid, "key-a")
    try:
        assert events.empty_for(1.0)  # paused: nothing runs before the first step
        for i, step in enumerate(settings):
            ok = httpx.post(
                f"{server}/ui/api/sessions/{sid}/step", json=step, headers=auth("key-a")
            )
            assert ok.json() == {"ok": True}
            event = events.next()
            assert event["type"] == "round", event
            rnd = event["round"]
            assert rnd["round"] == i and len(rnd["tokens"]) == rnd["emitted"]
            assert rnd["detail"]["positions"] and rnd["origins"]
            if step.get("k") == 0:
                assert rnd["proposed"] == 0 and rnd["origins"] == ["plain"]
            if step.get("drafter") == "model":
                assert rnd["drafter"] in ("model", None)
            assert events.empty_for(0.5)  # exactly one round per step
        got = httpx.post(f"{server}/ui/api/sessions/{sid}/run", headers=auth("key-a"))
        assert got.json() == {"ok": True}
        while (event := events.next())["type"] == "round":
            pass
        assert event["type"] == "done" and event["text"] == want
    finally:
        events.close()


def test_a_step_that_changes_sampling_says_so_and_bad_settings_are_refused(server):
    body = {"prompt": "The alphabet: a, b, c,", "max_tokens": 8, "temperature": 0, "paused": True}
    sid = httpx.post(f"{server}/ui/api/sessions", json=body, headers=auth("key-a")).json()["id"]
    events = Events(server, sid, "key-a")
    url = f"{server}/ui/api/sessions/{sid}/step"
    try:
        for bad, word in [({"k": 99}, "k"), ({"temperature": -1}, "temperature")]:
            r = httpx.post(url, json=bad, headers=auth("key-a"))
            assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
        httpx.post(url, json={}, headers=auth("key-a"))
        assert not events.next()["round"]["detail"]["params_changed"]
        httpx.post(url, json={"temperature": 0.7}, headers=auth("key-a"))
        detail = events.next()["round"]["detail"]
        assert detail["params_changed"] and detail["params"]["temperature"] == 0.7
        # Another tenant cannot see or drive this session.
        assert httpx.post(url, json={}, headers=auth("key-b")).status_code == 404
        gone = httpx.delete(f"{server}/ui/api/sessions/{sid}", headers=auth("key-a"))
        assert gone.json() == {"ok": True}
        # and its events stream ends, saying so (it would wait, and hold a server's shutdown)
        event = events.next(timeout=30)
        assert event["type"] == "error" and "cancelled" in event["message"], event
    finally:
        events.close()


def test_the_live_list_and_a_requests_view_stay_with_their_tenant(server):
    prompt = "Write the word hello three times."
    out = httpx.post(
        f"{server}/v1/completions",
        json={"prompt": prompt, "max_tokens": 12, "temperature": 0},
        headers=auth("key-b"),
        timeout=120,
    ).json()
    rows = httpx.get(f"{server}/ui/api/requests", headers=auth("key-b")).json()["requests"]
    row = next(r for r in rows if r["id"] == out["id"])
    assert row["state"] == "done" and row["label"] == prompt and row["emitted"] == 12
    assert row["source"] == "api" and row["tokens_per_s"] > 0
    mine = httpx.get(f"{server}/ui/api/requests", headers=auth("key-a")).json()["requests"]
    assert out["id"] not in {r["id"] for r in mine}
    assert (
        httpx.get(f"{server}/ui/api/requests/{out['id']}", headers=auth("key-a")).status_code == 404
    )
    view = httpx.get(f"{server}/ui/api/requests/{out['id']}", headers=auth("key-b")).json()
    assert "".join(p for r in view["rounds"] for p in r["pieces"]) == out["choices"][0]["text"]
    assert sum(len(r["origins"]) for r in view["rounds"]) == 12
    assert view["summary"]["emitted"] == 12 and view["prompt"].endswith(prompt)
    with httpx.stream("GET", f"{server}/ui/api/live", headers=auth("key-b"), timeout=30) as s:
        line = next(x for x in s.iter_lines() if x.startswith("data: "))
    assert out["id"] in {r["id"] for r in json.loads(line[6:])["requests"]}


def test_paused_sessions_may_hold_only_half_the_batch(server):
    body = {"prompt": "Hi", "max_tokens": 4, "paused": True}
    made = []
    try:
        for _ in range(2):  # max_batch 4: two paused sessions at most
            r = httpx.post(f"{server}/ui/api/sessions", json=body, headers=auth("key-a"))
            assert r.status_code == 200
            made.append(r.json()["id"])
        r = httpx.post(f"{server}/ui/api/sessions", json=body, headers=auth("key-a"))
        assert r.status_code == 429 and "paused" in r.json()["error"]["message"]
    finally:
        for sid in made:
            httpx.delete(f"{server}/ui/api/sessions/{sid}", headers=auth("key-a"))


def test_a_paused_job_holding_the_only_slot_leaves_the_queue_waiting_without_spinning(
    smollm2_path,
):
    engine = make_engine(smollm2_path)
    sched = Scheduler(engine, Metrics(), max_batch=1)
    loop = asyncio.new_event_loop()  # never run: the jobs' events only queue up
    ids = engine.target.tokenizer.encode("Hello there")
    held = Job("held", ids, SamplingParams(max_tokens=4), loop, paused=True, inspect=True)
    waiting = Job("waiting", ids, SamplingParams(max_tokens=4), loop)

    def until(cond, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while not cond():
            assert time.monotonic() < deadline, "the scheduler did not get there"
            time.sleep(0.02)

    try:
        sched.submit(held)
        sched.submit(waiting)
        until(lambda: held.state == "prefilling")
        cpu = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu < 0.3  # the worker waits; it does not spin
        assert waiting.state == "queued" and not held.req.rounds
        sched.grant(held)
        until(lambda: len(held.req.rounds) == 1)  # round 0: the prefill and the first token
        time.sleep(0.3)
        assert len(held.req.rounds) == 1 and len(held.req.details) == 1
        sched.resume(held)
        until(lambda: waiting.state == "done")
        assert held.state == "done" and held.result.summary.emitted == 4
    finally:
        sched.close()
        loop.close()


def test_a_session_body_obeys_the_servers_body_limit_even_when_chunked(server):
    def chunks():  # no content-length: the limit is enforced while reading
        for _ in range(5):
            yield b" " * (1 << 20)

    r = httpx.post(f"{server}/ui/api/sessions", content=chunks(), headers=auth("key-a"))
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    ok = httpx.get(f"{server}/ui/api/info", headers=auth("key-a"))
    assert ok.status_code == 200  # and the server goes on
