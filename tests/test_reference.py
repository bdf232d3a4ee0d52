"""docs/COMMANDS.md is the parser's reference (`specwise.cli.reference`), so it cannot drift
from the flags: a flag added, renamed or re-described fails here until it is regenerated."""

from __future__ import annotations

import argparse
from pathlib import Path

from specwise.cli import build_parser
from specwise.cli.reference import REGENERATE, markdown

COMMANDS = Path(__file__).resolve().parents[1] / "docs" / "COMMANDS.md"


def test_the_command_reference_is_what_the_parser_gives():
    assert COMMANDS.read_text() == markdown(), (
        f"docs/COMMANDS.md differs from the parser's reference: regenerate it with `{REGENERATE}` "
        "(python -m specwise.cli.reference > docs/COMMANDS.md) and commit it"
    )


def test_the_reference_has_every_command_and_every_flag():
    text = markdown()
    parser = build_parser()
    stack = [(parser, "specwise")]
    while stack:
        p, name = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, sp in action.choices.items():
                    assert f"## {name} {sub}" in text
                    stack.append((sp, f"{name} {sub}"))
            elif action.option_strings and "--help" not in action.option_strings:
                assert f"`{', '.join(action.option_strings)}" in text, action.option_strings
    assert "| `--quick` |  | one prompt per category" in text  # a switch: no value, no default
    assert "| `--suffix-scope {request,key,global}` | `key` |" in text  # choices and a default
