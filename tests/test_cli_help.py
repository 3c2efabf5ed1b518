"""Every argument of the ``hpcnb`` command line says what it is and what its default is."""

import argparse

import pytest

from hpcnb.cli import TECHNIQUE_CLIS, build_parser


def _parsers(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def _arguments(load):
    for name, parser in _parsers(build_parser(load), "hpcnb"):
        if load is None and name.split()[1:2] and name.split()[1] in TECHNIQUE_CLIS:
            continue  # listed only: their own parser is built with load=<name>
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if isinstance(action, argparse._VersionAction):
                continue
            yield name, action


@pytest.mark.parametrize("load", [None, *TECHNIQUE_CLIS])
def test_every_argument_has_help_and_states_its_default(load):
    missing, silent = [], []
    for name, action in _arguments(load):
        label = f"{name} {'/'.join(action.option_strings) or action.dest}"
        if not action.help:
            missing.append(label)
            continue
        default = action.default
        stated = "%(default)s" in action.help or "default" in action.help
        quiet = default in (None, False, argparse.SUPPRESS, [])
        if action.option_strings and not quiet and not stated:
            silent.append(f"{label} (default {default!r})")
    assert not missing, "arguments without help: " + ", ".join(missing)
    assert not silent, "defaults not stated: " + ", ".join(silent)


def test_help_renders_the_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "local Dask worker processes (default: 2)" in out
    assert "%(default)s" not in out


def test_a_technique_parser_lists_its_sub_commands(capsys):
    with pytest.raises(SystemExit):
        build_parser("batchsim").parse_args(["batchsim", "--help"])
    out = capsys.readouterr().out
    assert "simulate" in out and "generate" in out
    with pytest.raises(SystemExit):
        build_parser("batchsim").parse_args(["batchsim", "simulate", "--help"])
    assert "--malleable-fraction" in capsys.readouterr().out
