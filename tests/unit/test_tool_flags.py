"""A node tool takes its spec two ways: whole, as one JSON object (``--spec-json``: the Ansible module, the run
queue), or as flags (a user at a shell, bench/dead_time.py, scripts/gpu_validation.py). Both must be the same spec:
the flags are the spec's fields, a flag is required exactly where the field has no default, and a flag's default
is the field's. Otherwise a value resolved on the controller could be required on one way in and silently defaulted
on the other (gpufree's ``--gpus`` once defaulted to "all" where its spec required it).

Each tool's argparse parser is taken from its own ``parse_args`` (stopped before it parses), so the test reads the
flags the tool really declares. lease.py is not here: its subcommands each take a part of one spec, and which part
is checked after parsing, on both ways in (``lease.NEEDS``)."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict

import pytest

from specab.node import envcheck, gpufree, gpusample, loadgen, manifest, ready, sequence, start, stop

REQUIRED = "<required>"


class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def parser_of(parse_args: Any, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parser(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(_Parser) as got:
        parse_args([])
    monkeypatch.undo()
    return got.value.parser


def field_defaults(cls: type) -> Dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = REQUIRED
    return out


def flag_defaults(parser: argparse.ArgumentParser) -> Dict[str, Any]:
    return {a.dest: REQUIRED if a.required else a.default for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))}


TOOLS = {"envcheck": (envcheck.parse_args, envcheck.EnvCheckSpec), "gpufree": (gpufree.parse_args, gpufree.GpuFreeSpec),
         "gpusample": (gpusample.parse_args, gpusample.SampleSpec), "manifest": (manifest.parse_args, manifest.ManifestSpec),
         "ready": (ready.parse_args, ready.ReadySpec), "start": (start.parse_args, start.StartSpec),
         "stop": (stop.parse_args, stop.StopSpec), "loadgen": (loadgen.parse_args, loadgen.BenchConfig)}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tools_flags_are_its_specs_fields_with_the_same_defaults(tool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parse_args, spec = TOOLS[tool]
    assert flag_defaults(parser_of(parse_args, monkeypatch)) == field_defaults(spec)


# stage's batch comes on stdin with the flags (staging.py's document), as a field of its JSON spec
SEQUENCE_STDIN = {"stage": {"batch"}}


def test_each_sequence_command_takes_its_specs_fields_with_the_same_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = parser_of(sequence.parse_args, monkeypatch)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(sub.choices) == sorted(sequence.SPECS)
    shared = flag_defaults(parser)                            # --node-dir, before the command
    for command, cmd_parser in sub.choices.items():
        want = field_defaults(sequence.SPECS[command])
        for name in SEQUENCE_STDIN.get(command, ()):
            del want[name]
        assert {**shared, **flag_defaults(cmd_parser)} == want, command


def test_the_planted_difference_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison fails on the defect it guards against: a flag that defaults where its field is required."""
    def planted(argv: Any) -> Any:
        p = argparse.ArgumentParser()
        for f in dataclasses.fields(gpufree.GpuFreeSpec):
            p.add_argument("--" + f.name.replace("_", "-"), required=f.name != "gpus" and f.default is dataclasses.MISSING,
                           default="all" if f.name == "gpus" else f.default)
        return p.parse_args(argv)
    got = flag_defaults(parser_of(planted, monkeypatch))
    assert got != field_defaults(gpufree.GpuFreeSpec)
    assert {k for k in got if got[k] != field_defaults(gpufree.GpuFreeSpec)[k]} == {"gpus"}
