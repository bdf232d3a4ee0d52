"""Saved traces and bench runs as the inspector's source: grouping, views, filters, comparison,
and clear errors for what is not a trace."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from specwise import Engine, SamplingParams
from specwise.backends.torch_hf import TorchLM
from specwise.cli import main
from specwise.drafters import NgramDrafter
from specwise.server import inspector, saved
from specwise.trace import JsonlSink
from toy import tiny_llama

PROMPT = [1, 5, 3, 7, 2, 5, 3, 7, 2, 9]


def client(source) -> TestClient:
    app = FastAPI()
    inspector.add_routes(app, source)
    return TestClient(app)


def test_a_trace_groups_rounds_by_request_and_keeps_their_detail(tmp_path):
    path = tmp_path / "t.jsonl"
    with JsonlSink(path) as sink:
        eng = Engine(TorchLM(tiny_llama(vocab=16, seed=0, sharpen=4.0)), NgramDrafter(), k=3)
        eng.trace = sink
        for rid, inspect in (("a", True), ("b", False)):
            req = eng.start(PROMPT, SamplingParams(max_tokens=20), request_id=rid, inspect=inspect)
            while not req.done:
                eng.step([req])
            tokens = eng.finish(req).tokens
    c = client(saved.load(path))
    assert c.get("/ui/api/info").json()["mode"] == "trace"
    rows = {r["id"]: r for r in c.get("/ui/api/requests").json()["requests"]}
    assert set(rows) == {"a", "b"} and rows["a"]["emitted"] == 20
    view = c.get("/ui/api/requests/a").json()
    assert [t for r in view["rounds"] for t in r["tokens"]] == tokens
    assert all(r["detail"]["positions"] for r in view["rounds"])
    plain = c.get("/ui/api/requests/b").json()  # not inspected: rounds, no tokens
    assert [r["detail"] for r in plain["rounds"]] == [None] * len(plain["rounds"])
    assert sum(len(r["origins"]) for r in plain["rounds"]) == 20
    assert c.get("/ui/api/requests/zzz").status_code == 404


def _bench_folder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    records = []
    for config, tokens in (("plain | T=0", [1, 2, 3, 4]), ("ngram k=4 | T=0", [1, 2, 9, 4])):
        check = {} if config.startswith("plain") else {"match": False, "position": 2}
        check |= {"top2_gap": 0.01, "near_tie": True} if check else {}
        records.append(
            {
                "config": config,
                "spec": config.split(" | ")[0],
                "category": "code",
                "prompt_id": "code-01",
                "repeat": 0,
                "tokens": tokens,
                "pieces": [f"<{t}>" for t in tokens],
                "finish_reason": "length",
                "summary": {"emitted": 4},
                "check": check,
            }
        )
    rounds = [
        {"config": "plain | T=0", "prompt_id": "code-01", "repeat": 0, "request_id": "x",
         "round": i, "drafter": None, "proposed": 0, "accepted": 0, "rejection_position": None,
         "bonus": True, "emitted": 1, "draft_ms": 0.0, "verify_ms": 10.0, "overhead_ms": 0.0,
         "batch_size": 1, "t_ms": 10.0 * (i + 1)}
        for i in range(4)
    ]  # fmt: skip
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (out / "summary.json").write_text(json.dumps({"run": {"target": "/m/q.gguf"}, "figures": {}}))
    (out / "speedup_vs_k.png").write_bytes(b"\x89PNG")
    return out


def test_a_bench_run_lists_filters_views_and_compares(tmp_path):
    c = client(saved.load(_bench_folder(tmp_path)))
    info = c.get("/ui/api/info").json()
    assert info["mode"] == "bench" and info["model"] == "q.gguf" and info["read_only"]
    bench = c.get("/ui/api/bench").json()
    assert bench["plots"] == ["speedup_vs_k.png"] and bench["categories"] == ["code"]
    assert c.get("/ui/api/bench/plots/speedup_vs_k.png").content == b"\x89PNG"
    assert c.get("/ui/api/bench/plots/..%2Fsummary.json").status_code == 404
    rows = c.get("/ui/api/requests", params={"config": "plain | T=0"}).json()["requests"]
    assert len(rows) == 1 and rows[0]["rounds"] == 4 and rows[0]["category"] == "code"
    a, b = (r["id"] for r in c.get("/ui/api/requests").json()["requests"])
    view = c.get(f"/ui/api/requests/{quote(a)}").json()  # ids hold spaces, | and #
    assert view["text"] == "<1><2><3><4>" and view["rounds"][0]["pieces"] == ["<1>"]
    got = c.get("/ui/api/compare", params={"a": a, "b": b}).json()
    assert got["divergence"] == {"position": 2, "gap": 0.01, "near_tie": True}
    assert got["b"]["check"]["position"] == 2


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p / "none.jsonl", "does not exist"),
        (
            lambda p: (p / "bad.jsonl").write_text('{"a": 1}\nnot json\n') and p / "bad.jsonl",
            "line 2",
        ),
        (lambda p: (p / "e.jsonl").write_text('{"a": 1}\n') and p / "e.jsonl", "no rounds"),
        (lambda p: p, "neither"),
    ],
)
def test_what_is_not_a_trace_is_one_clear_error(tmp_path, capsys, make, words):
    path = make(tmp_path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and err.count("\n") == 1
