"""``oncelog --help`` and ``--version``: every flag documented, plain text (issue 10)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

import oncelog
from oncelog.cli import build_parser, main


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


def test_every_flag_has_help() -> None:
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in parsers(build_parser())
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not (a.help and a.help.strip())
    ]
    assert missing == []


def test_help_has_no_rest_markup() -> None:
    for p in parsers(build_parser()):
        text = p.format_help()
        assert not re.search(r"``|:(class|func|meth|mod):`", text), (p.prog, text)


def test_log_level_lists_its_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "debug, info, warning, error, critical" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"oncelog {oncelog.__version__}"
