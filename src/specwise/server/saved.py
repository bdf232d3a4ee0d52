"""Saved runs as the trace inspector's source (`specwise inspect PATH`), read only.

- a trace (`generate --trace FILE`, `serve --trace FILE`, or a run folder's rounds.jsonl): one
  JSON object per round, grouped into requests by `request_id`; rounds recorded with their
  detail (inspected requests: `generate --trace`, the page's sessions) show their text;
- a bench run folder (`specwise bench --out DIR`): requests.jsonl (every request's tokens, their
  pieces of text and its equivalence check), rounds.jsonl and summary.json (the report's
  figures), and the plots beside them.

Loading reads the whole file into memory once; a line that is not a JSON object is an error
naming the file and line. Views are built on request (`views`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from specwise.server.views import divergence, request_row, request_view

__all__ = ["Bench", "Trace", "load"]


def _lines(path: Path) -> list[dict]:
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}, line {n}, is not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}, line {n}, is not a JSON object")
            out.append(obj)
    return out


def load(path: str | Path) -> Trace | Bench:
    """The source for a trace file or a run folder (ValueError, in one sentence, otherwise)."""
    path = Path(path)
    if path.is_dir():
        if (path / "requests.jsonl").is_file():
            return Bench(path)
        if (path / "rounds.jsonl").is_file():
            return Trace(path / "rounds.jsonl")
        raise ValueError(
            f"{path} holds neither requests.jsonl (a bench run) nor rounds.jsonl (a trace)"
        )
    if not path.is_file():
        raise ValueError(f"{path} does not exist; give a trace file (.jsonl) or a run folder")
    return Trace(path)


def _info(mode: str, source: Path, model: str | None) -> dict[str, Any]:
    return {
        "mode": mode,
        "model": model,
        "drafters": [],
        "auto": False,
        "default_k": 0,
        "read_only": True,
        "source": str(source),
    }


class Trace:
    """A trace file: its rounds, grouped by request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: dict[str, list[dict]] = defaultdict(list)
        for obj in _lines(path):
            if "request_id" in obj and "round" in obj:
                self.requests[str(obj["request_id"])].append(obj)
        if not self.requests:
            raise ValueError(f"{path} has no rounds (lines with request_id and round)")

    def info(self) -> dict[str, Any]:
        return _info("trace", self.path, None)

    def rows(self, tenant: str | None = None, **_: str | None) -> list[dict]:
        return [request_row(rid, rid, "done", rs, "trace") for rid, rs in self.requests.items()]

    def view(self, tenant: str | None, rid: str) -> dict | None:
        rounds = self.requests.get(rid)
        if rounds is None:
            return None
        details = [r.get("detail") for r in rounds]
        text = "".join(p for d in details if d and d.get("pieces") for p in d["pieces"])
        return request_view(rid, rid, "done", rounds, None, None, details, text=text or None)


class Bench:
    """A bench run folder: its requests, rounds, figures and plots."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.records: dict[str, dict] = {}
        for rec in _lines(folder / "requests.jsonl"):
            self.records[self._id(rec)] = rec
        self.rounds: dict[str, list[dict]] = defaultdict(list)
        if (folder / "rounds.jsonl").is_file():
            for r in _lines(folder / "rounds.jsonl"):
                self.rounds[self._id(r)].append(r)
        summary = folder / "summary.json"
        self.summary = json.loads(summary.read_text()) if summary.is_file() else {}

    @staticmethod
    def _id(rec: dict) -> str:
        return f"{rec['config']} @ {rec['prompt_id']} #{rec.get('repeat', 0)}"

    def info(self) -> dict[str, Any]:
        run = self.summary.get("run", {})
        model = run.get("target")
        return _info("bench", self.folder, Path(model).name if model else None)

    def rows(
        self,
        tenant: str | None = None,
        config: str | None = None,
        category: str | None = None,
        prompt_id: str | None = None,
    ) -> list[dict]:
        out = []
        for rid, rec in self.records.items():
            if config and rec["config"] != config:
                continue
            if category and rec["category"] != category:
                continue
            if prompt_id and rec["prompt_id"] != prompt_id:
                continue
            label = f"{rec['prompt_id']} #{rec.get('repeat', 0)}"
            out.append(
                request_row(
                    rid,
                    label,
                    rec.get("finish_reason") or "done",
                    self.rounds.get(rid, []),
                    "bench",
                    rec["config"],
                    rec["category"],
                    rec["prompt_id"],
                )
            )
        return out

    def view(self, tenant: str | None, rid: str) -> dict | None:
        rec = self.records.get(rid)
        if rec is None:
            return None
        text = "".join(rec["pieces"]) if rec.get("pieces") else None
        return request_view(
            rid,
            f"{rec['prompt_id']} #{rec.get('repeat', 0)} · {rec['config']}",
            "done",
            self.rounds.get(rid, []),
            rec.get("tokens"),
            rec.get("pieces"),
            text=text,
            finish_reason=rec.get("finish_reason"),
            summary=rec.get("summary"),
            check=rec.get("check") or None,
        )

    def bench(self) -> dict[str, Any]:
        figures = self.summary.get("figures", {})
        return {
            "run": self.summary.get("run", {}),
            "figures": figures,
            "lossy": self.summary.get("lossy", {}),  # lossy rules' figures, shown apart
            "plots": sorted(p.name for p in self.folder.glob("*.png")),
            "configs": sorted({rec["config"] for rec in self.records.values()}),
            "categories": sorted({rec["category"] for rec in self.records.values()}),
        }

    def plot(self, name: str) -> Path | None:
        path = self.folder / name
        ok = name.endswith(".png") and "/" not in name and path.is_file()
        return path if ok else None

    def compare(self, a: str, b: str) -> dict | None:
        va, vb = self.view(None, a), self.view(None, b)
        if va is None or vb is None:
            return None
        part = divergence(self.records[a].get("tokens", []), self.records[b].get("tokens", []))
        # A greedy check is made against plain decoding: where it names this very position,
        # its top-2 gap and near-tie verdict apply.
        for rec in (self.records[b], self.records[a]):
            check = rec.get("check") or {}
            if part["position"] is not None and check.get("position") == part["position"]:
                part["gap"], part["near_tie"] = check.get("top2_gap"), check.get("near_tie")
                break
        return {"a": va, "b": vb, "divergence": part}
