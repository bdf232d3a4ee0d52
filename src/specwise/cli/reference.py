"""The command reference, docs/COMMANDS.md, written from the parser itself (`build_parser`):
every command and subcommand in `--help`'s order, its help, and a table of its arguments
(flag, value, default, help). `make docs` (`python -m specwise.cli.reference >
docs/COMMANDS.md`) writes it; tests/test_reference.py fails while the file differs from what
the parser gives, so the reference cannot drift from the flags.

It reads the parser's actions only (argparse's own help text wraps to the terminal and changes
between Python versions; this does not). It runs no command and is no command's module.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from specwise.cli import build_parser

__all__ = ["REGENERATE", "markdown"]

REGENERATE = "make docs"  # or: python -m specwise.cli.reference > docs/COMMANDS.md


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(the command's words, its parser, its one-line help), depth first in --help's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name, "")
                yield from _commands(sub, (*path, name))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs == 0:  # a switch
            return f"`{flags}`"
        value = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else action.dest.upper()
        )
        return f"`{flags} {value}`"
    return f"`{action.metavar or action.dest}`"


def _default(action: argparse.Action) -> str:
    d = action.default
    if action.nargs == 0 or d is None or d == argparse.SUPPRESS or d == []:
        return ""
    return f"`{d}`"


def _table(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = [
        f"| {_argument(a)} | {_default(a)} | {_cell(formatter._expand_help(a) if a.help else '')} |"
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]
    return ["| argument | default | what it does |", "|---|---|---|", *rows] if rows else []


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    parser = parser or build_parser()
    commands = list(_commands(parser))
    out = [
        "# specwise commands",
        "",
        f"Generated from the parser (`specwise.cli.build_parser`) by `{REGENERATE}`; do not edit",
        "by hand (`tests/test_reference.py` fails while this file differs from the parser).",
        f"`specwise COMMAND --help` prints the same. {_cell(parser.description or '')}",
        "",
    ]
    out += [
        f"- [`specwise {' '.join(w)}`](#{'-'.join(('specwise', *w))}): {_cell(h)}"
        for w, _, h in commands
    ]
    for words, sub, help_ in commands:
        out += ["", f"## specwise {' '.join(words)}", ""]
        out += [_cell(sub.description or help_), ""] if (sub.description or help_) else []
        subs = [w[-1] for w, _, _ in commands if w[:-1] == words]
        if subs:
            out += [f"Subcommands: {', '.join(f'`{s}`' for s in subs)}.", ""]
        out += _table(sub)
    return "\n".join(out).replace("\n\n\n", "\n\n").rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
