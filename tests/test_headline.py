"""BENCHMARKS.md's headline is what `specwise bench headline` makes of the committed run
summaries (benchmarks/*.json), holds no figure they do not, and comes first in a document of at
most 600 lines; a summary that is not one is one sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specwise.bench.headline import BEGIN, END, into, load, markdown
from specwise.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
SUMMARIES = ROOT / "benchmarks"


def test_the_headline_in_benchmarks_md_is_what_the_summaries_give():
    doc = BENCHMARKS.read_text()
    section = doc[doc.index(BEGIN) : doc.index(END) + len(END)]
    assert section == markdown(load(SUMMARIES)), (
        "BENCHMARKS.md's headline differs from benchmarks/*.json: rebuild it with "
        "`specwise bench headline --into BENCHMARKS.md` (or `make docs`) and commit it"
    )


def test_benchmarks_md_opens_with_the_headline_and_stays_short():
    doc = BENCHMARKS.read_text()
    sections = re.findall(r"^## (.+)$", doc, re.M)
    assert sections[0].startswith("Headline") and sections[1] == "Learned drafters: the eagle layer"
    assert doc.index("## Headline") < doc.index(BEGIN) < doc.index(END) < doc.index("## Learned")
    assert len(doc.splitlines()) <= 600
    assert "git keeps" in doc.split("## ")[0]


def test_every_figure_of_the_headline_is_a_summarys():
    """Numbers in the headline's tables are the summaries' values (as printed: 2 decimals for
    ratios, as stored for tokens/s), never computed ones."""
    runs = load(SUMMARIES)
    values: set[str] = set()

    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, int | float):
            values.update({f"{x:.2f}", f"{x:g}", str(x)})
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for r in runs:
        walk(r.get("bench", {}))
        walk(r.get("server", {}))
    tables = [line for line in markdown(runs).splitlines() if line.startswith("| ")]
    shown = {n for line in tables for n in re.findall(r"(?<![\w.=])\d+\.\d+(?![\w.])", line)}
    assert shown and shown <= values, shown - values


def test_every_summary_names_its_machine_command_and_commit():
    for path in sorted(SUMMARIES.glob("*.json")):
        run = json.loads(path.read_text())
        assert run["lscpu"] and run["command"] and run["source"].startswith("§"), path
        assert run.get("commit") or run.get("commit_note"), path


def test_a_bad_summary_is_one_sentence(tmp_path, capsys):
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"a\.json is not a readable JSON run summary"):
        load(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"machine": "m", "lscpu": "m", "bench": {}}))
    with pytest.raises(ValueError, match=r"a\.json lacks command, source, what"):
        load(tmp_path)
    assert main(["bench", "headline", "--from", str(tmp_path / "none")]) == 2
    assert "holds no run summaries" in capsys.readouterr().err


def test_headline_into_replaces_only_its_section(tmp_path, capsys):
    run = {
        "machine": "M",
        "lscpu": "M",
        "command": "specwise bench --quick",
        "source": "§0",
        "what": "a demo",
        "commit": "abc1234",
        "date": "2026-12-01",
        "bench": {
            "T=0": {"all": {"auto": 1.2, "auto_ci95": [1.1, 1.3], "auto_over_mainline": 1.4}}
        },
    }
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "m.json").write_text(json.dumps(run))
    doc = tmp_path / "B.md"
    doc.write_text(f"# B\n\n{BEGIN}\nold\n{END}\n\n## after\n")
    assert main(["bench", "headline", "--from", str(tmp_path / "runs"), "--into", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# B\n\n" + BEGIN) and text.endswith(END + "\n\n## after\n")
    assert "| M | §0, `abc1234`: a demo | not recorded | 1.40x | 1.20x (1.10–1.30) |" in text
    assert "old" not in text
    with pytest.raises(ValueError, match="has no headline section"):
        into(tmp_path / "runs" / "m.json", "x")
