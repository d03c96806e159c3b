"""Every command's help has an example, and every option says what it does."""

from __future__ import annotations

import argparse

import pytest

from hybridsearch import __version__
from hybridsearch.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, path: list[str]):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, [*path, name])
    yield path, parser


def test_every_command_has_an_example_and_every_option_a_help() -> None:
    missing = []
    for path, parser in _commands(build_parser(), []):
        if not path:
            continue
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
        if leaf and "Example: " not in (parser.description or ""):
            missing.append(f"{' '.join(path)}: no example")
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction | argparse._SubParsersAction) or a.help == argparse.SUPPRESS:
                continue
            if not a.help:
                missing.append(f"{' '.join(path)} {a.option_strings or a.dest}: no help")
    assert not missing, missing


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"hybridsearch {__version__}"


@pytest.mark.parametrize("argv", [["search", "x", "-k", "abc"], ["search", "x", "--engine", "nosuch"], ["nosuchcmd"],
                                  ["indices"], ["opensearch", "nosuch"]])
def test_a_usage_error_is_one_line(argv, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "--help`)" in err and "usage:" not in err
