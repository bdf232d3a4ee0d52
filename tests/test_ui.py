"""The trace inspector's page in a real headless browser (Debian's Chromium, driven by Playwright):
a request streams with coloured tokens, hovering shows the round, step mode advances one round per
click and ends with the API's text, a 10,000-round trace opens in under 2 s, the bench and compare
views. Skipped, saying why, where Chromium or Playwright is missing (`make browser`)."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
from urllib.parse import quote

import httpx
import pytest

from specwise.server import inspector, saved
from specwise.server.app import create_app
from test_saved import _bench_folder
from test_server import MODEL, make_engine, serving

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[dev]')"
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (run `make browser`)"
)
KEY = "ui-key"
COUNT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # the n-gram drafter's drafts are kept here


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert not errors, f"the page raised: {errors}"


@pytest.fixture(scope="module")
def live(smollm2_path):
    app = create_app(make_engine(smollm2_path), MODEL, max_batch=4, max_queue=8, api_keys=[KEY])
    with serving(app) as url:
        yield url


def open_live(page, url: str) -> None:
    """Open the page on a live server and give it the key when it asks."""
    page.goto(f"{url}/ui#run")
    page.wait_for_selector("#key-form", state="visible")
    page.fill("#key-input", KEY)
    page.click("#key-submit")
    page.wait_for_selector("#start", state="visible")


def start(page, prompt: str, **fields: str) -> None:
    page.fill("#prompt", prompt)
    for name, value in fields.items():
        sel = f"#{name.replace('_', '-')}"
        if page.eval_on_selector(sel, "e => e.tagName") == "SELECT":
            page.select_option(sel, value)
        elif value in ("on", "off"):
            page.set_checked(sel, value == "on")
        else:
            page.fill(sel, value)
    page.click("#start")


def api_text(url: str, body: dict) -> str:
    r = httpx.post(
        f"{url}/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    return r.json()["choices"][0]["text"]


def rounds_shown(page) -> int:
    return page.locator("#text .round-start").count()


def test_a_request_streams_with_coloured_tokens_and_hover_shows_its_round(page, live):
    open_live(page, live)
    start(page, COUNT, max_tokens="32", temperature="0", k="4", drafter="ngram")
    page.wait_for_selector("#final-text", state="attached", timeout=120_000)
    page.wait_for_function("document.querySelector('#final-text').textContent.length > 0")
    tokens = page.locator("#text .tok")
    assert tokens.count() == 32
    assert page.locator("#text .tok-accepted").count() > 0
    assert page.locator("#text .tok-accepted").first.get_attribute("data-drafter") == "ngram"
    want = api_text(
        live,
        {
            "prompt": COUNT,
            "max_tokens": 32,
            "temperature": 0,
            "speculative": {"k": 4, "drafter": "ngram"},
        },
    )
    assert page.text_content("#final-text") == want
    page.locator("#text .tok-accepted").first.hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert "round" in text.lower() and "ngram" in text and "verify" in text.lower()
    assert "top" in text.lower()  # the top of p at that position


def test_step_mode_advances_one_round_per_click_and_ends_with_the_apis_text(page, live):
    open_live(page, live)
    body = {"prompt": "Name five colours:", "max_tokens": 20, "temperature": 0.8, "seed": 5}
    start(
        page,
        body["prompt"],
        max_tokens="20",
        temperature="0.8",
        seed="5",
        k="3",
        drafter="ngram",
        paused="on",
    )
    page.wait_for_selector("#step:not([disabled])")
    assert rounds_shown(page) == 0  # paused before round 0
    for n in range(1, 4):
        page.click("#step")
        page.wait_for_function(
            f"document.querySelectorAll('#text .round-start').length >= {n}", timeout=60_000
        )
        page.wait_for_selector("#step:not([disabled])")
        time.sleep(0.3)
        assert rounds_shown(page) == n  # exactly one round per click
    page.click("#run-to-end")
    page.wait_for_function(
        "document.querySelector('#final-text') && "
        "document.querySelector('#final-text').textContent.length > 0",
        timeout=120_000,
    )
    want = api_text(live, {**body, "speculative": {"k": 3, "drafter": "ngram"}})
    assert page.text_content("#final-text") == want
    assert "done" in page.text_content("#status")


def big_trace(path, rounds: int = 10_000) -> int:
    """A synthetic trace of one request with `rounds` rounds, each with its detail; returns
    the number of tokens it emitted."""
    rng = random.Random(0)
    emitted = 0
    with path.open("w") as f:
        for i in range(rounds):
            k = rng.choice([0, 2, 4])
            acc = rng.randint(0, k)
            n = acc + 1
            toks = [rng.randrange(1000) for _ in range(n)]
            positions = [
                {
                    "token": t,
                    "proposed": t,
                    "proposed_piece": f" w{t}",
                    "p": 0.5,
                    "q": 1.0,
                    "p_proposed": 0.5,
                    "q_proposed": 1.0,
                    "gap": 1.0,
                    "top": [[t + j, f" w{t + j}", 0.5 / (j + 1)] for j in range(5)],
                }
                for t in toks
            ]
            detail = {
                "draft": toks[:k],
                "draft_pieces": [f" w{t}" for t in toks[:k]],
                "parents": None,
                "tokens": toks,
                "pieces": [f" w{t}" for t in toks],
                "p_kind": "softmax",
                "params": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
                "params_changed": False,
                "positions": positions,
            }
            r = {
                "request_id": "big",
                "round": i,
                "drafter": "ngram" if k else None,
                "proposed": k,
                "accepted": min(acc, k),
                "rejection_position": None if acc == k else acc,
                "bonus": acc == k,
                "emitted": n,
                "draft_ms": 0.1,
                "verify_ms": 80.0,
                "overhead_ms": 1.0,
                "batch_size": 1,
                "t_ms": 81.1 * (i + 1),
                "detail": detail,
            }
            f.write(json.dumps(r) + "\n")
            emitted += n
    return emitted


@contextlib.contextmanager
def inspecting(source):
    from fastapi import FastAPI

    app = FastAPI()
    inspector.add_routes(app, source)
    with serving(app) as url:
        yield url


def test_a_10000_round_trace_renders_in_under_2_seconds(page, tmp_path):
    path = tmp_path / "big.jsonl"
    n = big_trace(path)
    with inspecting(saved.load(path)) as url:
        page.goto(f"{url}/ui")
        page.wait_for_selector("#requests-table tr[data-id]")
        t0 = time.perf_counter()
        page.goto(f"{url}/ui#request/big")
        page.wait_for_function(
            f"document.querySelectorAll('#text .tok').length === {n}", timeout=30_000
        )
        took = time.perf_counter() - t0
        print(f"{n} tokens in 10,000 rounds rendered in {took:.2f} s")
        assert took < 2.0, f"{n} tokens in 10,000 rounds took {took:.2f} s to render"
        middle = page.locator("#text .tok").nth(n // 2)
        middle.scroll_into_view_if_needed()
        page.wait_for_timeout(200)  # the scroll's own event hides any tooltip: let it pass
        middle.hover()
        page.locator("#tip").wait_for(state="visible")
        assert f"round {middle.get_attribute('data-round')}" in page.inner_text("#tip").lower()


def test_the_bench_view_links_cells_to_requests_and_compares_two(page, tmp_path):
    with inspecting(saved.load(_bench_folder(tmp_path))) as url:
        page.goto(f"{url}/ui")
        page.wait_for_selector(".bench-table")
        cell = page.locator(".bench-table a").first
        cell.click()
        page.wait_for_selector("#requests-table tr[data-id]")
        rows = httpx.get(f"{url}/ui/api/requests").json()["requests"]
        a, b = (r["id"] for r in rows)
        page.goto(f"{url}/ui#compare?a={quote(a)}&b={quote(b)}")
        page.wait_for_selector(".compare-text .tok")
        assert page.locator(".compare-text").count() == 2
        assert page.locator(".compare-text .diverged").count() > 0
        assert "2" in page.inner_text("#compare-header") or "near" in page.content()
