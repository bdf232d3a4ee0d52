"""Screenshots of the trace inspector's views for the README (docs/ui/*.png), taken in Debian's
headless Chromium with Playwright from a running `specwise serve` and a bench run folder:

    specwise serve --pair qwen-coder --port 8311 &
    specwise bench --pair qwen-coder --categories code_editing,chat --limit 2 \\
        --drafter ngram --k 4 --max-tokens 64 --temperature 0 --out /tmp/ui-bench
    python scripts/ui_screenshots.py --url http://127.0.0.1:8311 --bench /tmp/ui-bench

It drives the page as a user would (no data is faked): a request run from the page with a token
hovered, a step-mode session after a few steps, the live list while API requests run, then
`specwise inspect` over the bench folder for the bench and compare views.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
from playwright.sync_api import sync_playwright

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
EDIT = (
    "Rename the variable `total` to `subtotal` in this function and return the whole function:\n"
    "def price(items, tax):\n    total = 0\n    for item in items:\n"
    "        total += item.price * item.quantity\n    total = total * (1 + tax)\n"
    "    return round(total, 2)\n"
)


def run_from_page(page, prompt: str, paused: bool) -> None:
    page.goto(page.url.split("#")[0] + "#run")
    page.wait_for_selector("#start", state="visible")
    page.fill("#prompt", prompt)
    page.set_checked("#chat", True)
    page.fill("#max-tokens", "96")
    page.fill("#temperature", "0")
    page.select_option("#k", "auto")
    page.set_checked("#paused", paused)
    page.click("#start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="a running specwise serve (no API key)")
    ap.add_argument("--bench", required=True, help="a bench run folder")
    ap.add_argument("--out", default="docs/ui", help="folder for the PNGs (docs/ui)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium")
    if chromium is None:
        print("Debian's chromium is not installed (make browser)", file=sys.stderr)
        return 2
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.goto(f"{a.url}/ui#run")
        # 1. A request run from the page, a kept draft token hovered.
        run_from_page(page, EDIT, paused=False)
        page.wait_for_function(
            "document.querySelector('#final-text')?.textContent.length > 0", timeout=300_000
        )
        page.mouse.move(0, 0)  # off any token the text grew under the pointer
        page.wait_for_selector("#tip", state="hidden")
        page.locator("#text .tok-accepted").nth(3).hover()
        page.wait_for_selector("#tip", state="visible")
        page.screenshot(path=out / "request.png")
        # 2. Step mode: paused, a few steps, k changed on the way.
        run_from_page(page, "Write a haiku about a cache miss.", paused=True)
        for k in ("auto", "auto", "0", "4"):
            page.wait_for_selector("#step:not([disabled])")
            page.select_option("#step-k", k)
            page.click("#step")
        page.wait_for_selector("#step:not([disabled])")
        page.screenshot(path=out / "step.png")
        page.click("#cancel")

        # 3. The live list while API requests run.
        def ask(i: int) -> None:
            body = {"prompt": f"Count to {20 + i} in words.", "max_tokens": 64}
            httpx.post(f"{a.url}/v1/completions", json=body, timeout=600)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        page.goto(f"{a.url}/ui#live")
        time.sleep(6)
        page.screenshot(path=out / "live.png")
        for t in threads:
            t.join()
        # 4. A bench run: its tables, then two configurations side by side.
        port = 8766
        inspect = subprocess.Popen(
            [sys.executable, "-m", "specwise", "inspect", a.bench, "--port", str(port)]
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    httpx.get(f"{base}/ui/api/info")
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            page.goto(f"{base}/ui#bench")
            page.wait_for_selector(".bench-table")
            page.screenshot(path=out / "bench.png")
            rows = httpx.get(f"{base}/ui/api/requests").json()["requests"]
            plain = next(r for r in rows if r["config"].startswith("plain |"))
            other = next(
                r
                for r in rows
                if r["prompt_id"] == plain["prompt_id"] and not r["config"].startswith("plain")
            )
            page.goto(f"{base}/ui#compare?a={quote(plain['id'])}&b={quote(other['id'])}")
            page.wait_for_selector(".compare-text .tok")
            page.screenshot(path=out / "compare.png")
        finally:
            inspect.terminate()
        browser.close()
    print(f"wrote {', '.join(sorted(p.name for p in out.glob('*.png')))} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
