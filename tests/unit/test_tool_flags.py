"""A node tool takes its spec two ways: whole, as one JSON object (``--spec-json``: the Ansible module, the run
queue), or as flags (a user at a shell, bench/dead_time.py, scripts/gpu_validation.py). Both must be the same spec:
the flags are the spec's fields, a flag is required exactly where the field has no default, and a flag's default
is the field's. Otherwise a value resolved on the controller could be required on one way in and silently defaulted
on the other (gpufree's ``--gpus`` once defaulted to "all" where its spec required it).

Each tool's argparse parser is taken from its own ``parse_args`` (stopped before it parses), so the test reads the
flags the tool really declares. lease.py is not here: its subcommands each take a part of one spec, and which part
is checked after parsing, on both ways in (``lease.NEEDS``).

The same values given as flags and as the JSON spec build equal specs, and a required flag left out exits 2
naming it (argparse's usage error, what a role sees)."""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
from typing import Any, Dict

import pytest

from specab.node import cli, envcheck, gpufree, gpusample, instance, loadgen, manifest, ready, sequence, start, stop
from specab.node.cli import spec_of

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
         "stop": (stop.parse_args, stop.StopSpec), "loadgen": (loadgen.parse_args, loadgen.BenchConfig),
         "instance": (instance.parse_args, instance.InstanceSpec)}


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


# Every field of each tool's spec, none at its default: the flags and the JSON spec must build the same spec from them.
SMI = ["fake-smi", "--id=0"]
VALUES: Dict[str, Dict[str, Any]] = {
    "gpufree": dict(smi=SMI, gpus="0,1", threshold_mib=64.5, timeout=30.0, interval=0.25, node_dir="/nd",
                    smi_timeout=4.0, out="/r/gpu_free.json", csv="/r/gpu.csv"),
    "ready": dict(url="http://h:1", pid=123, log="/r/server.log", timeout=60.0, interval=0.5, traceback_grace=10.0,
                  phases_out="/r/ready.json", progress="/r/ready_progress.json"),
    "start": dict(node_dir="/nd", run_dir="/r", script="/r/launch.sh", host="127.0.0.1", port=30000, run_id="001-a",
                  arm="a", log="/r/s.log", instance="1"),
    "stop": dict(node_dir="/nd", smi=SMI, grace=5.0, kill_wait=3.0, force_foreign=True, smi_timeout=4.0,
                 out="/r/stop.json", sequencer_grace=7.0),
    "manifest": dict(run_dir="/r", node_dir="/nd", smi=SMI, python="/py", args_json="/a.json", env_file="/e.env",
                     launch="/l.sh", model_path="/m", draft_model_path="/d", seed="7", extra=["a=1", "b=2"],
                     probe_timeout=9.0, smi_timeout=4.0, out="/r/m.json"),
    "envcheck": dict(node_dir="/nd", env_file="/e.env", expected_args="/a.json", url="http://h:1", no_server_info=True,
                     log=["/l1", "/l2"], http_timeout=3.0, allow_unverified=True, out="/o.json",
                     server_info_out="/s.json"),
    "instance": dict(action="reset", node_dir="/nd", instance="7", run_dir="/r", run_id="008-a-c8", arm="a-c8",
                     url="http://h:1", engine="vllm", timeout=9.0),
    "gpusample": dict(smi=SMI, interval=0.5, out="/g.csv", gpus="0", count=3, duration=2.5, smi_timeout=4.0,
                      keep_after_parent_exit=True),
    "loadgen": dict(url="http://h:1", api="chat", num_requests=5, warmup=1, input_len=16, output_len=8, concurrency=4,
                    seed=3, timeout=20.0, ignore_eos=True, request_rate=2.5, client_procs=2, out="/b.jsonl",
                    summary="/s.json", model="m", phase_metrics="/p.json", dataset="/d.jsonl", temperature=0.7,
                    top_p=0.9),
}
SEQUENCE_VALUES: Dict[str, Dict[str, Any]] = {
    "ensure": dict(experiment_id="exp1", idle_timeout=60.0, lease_s=600.0, gpus="0,1", gpu_free_timeout=30.0,
                   gpu_free_threshold_mib=64.0, stop_grace=5.0, smi=SMI),
    "reset": dict(experiment_id="exp1", stop_grace=5.0, gpu_free_timeout=30.0),
    "wait": dict(run_id="001-a", timeout=9.0, pack="/p.tar", also=["002-b", "003-a"]),
    "finish": dict(experiment_id="exp1"),
    "stage": dict(experiment_id="exp1", finish=True),
}
SEQUENCE_VALUES["serve"] = SEQUENCE_VALUES["ensure"]
JSON_LISTS = {"smi"}                     # the other list flags are given once per item


def argv_of(values: Dict[str, Any]) -> list:
    """The command line a role writes for these values: --field-name VALUE, a switch bare, true|false words for
    loadgen's --ignore-eos, a JSON list for --smi, a repeated flag per item of the other lists."""
    argv = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if name == "ignore_eos":
            argv += [flag, "true" if value else "false"]
        elif isinstance(value, bool):
            argv += [flag] if value else []
        elif name in JSON_LISTS:
            argv += [flag, json.dumps(value)]
        elif isinstance(value, list):
            argv += [a for item in value for a in (flag, item)]
        else:
            argv += [flag, str(value)]
    return argv


def test_the_values_set_every_field_away_from_its_default() -> None:
    for tool, values in VALUES.items():
        defaults = field_defaults(TOOLS[tool][1])
        assert set(values) == set(defaults) and all(values[k] != defaults[k] for k in values), tool
    for command, values in SEQUENCE_VALUES.items():
        defaults = field_defaults(sequence.SPECS[command])
        assert set(values) | {"node_dir"} | set(SEQUENCE_STDIN.get(command, ())) == set(defaults), command
        assert all(values[k] != defaults[k] for k in values), command


@pytest.mark.parametrize("tool", sorted(VALUES))
def test_the_flags_and_the_json_spec_build_the_same_spec(tool: str) -> None:
    parse_args, cls = TOOLS[tool]
    from_flags = parse_args(argv_of(VALUES[tool]))
    # gpusample and loadgen take no --spec-json: their spec as the JSON path would build it
    whole = (spec_of(cls, dict(VALUES[tool])) if tool in ("gpusample", "loadgen")
             else parse_args([cli.SPEC_FLAG, json.dumps(VALUES[tool])]))
    assert from_flags == whole == cls(**VALUES[tool])


@pytest.mark.parametrize("command", sorted(SEQUENCE_VALUES))
def test_each_sequence_command_builds_the_same_spec_from_flags_and_json(command: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    batch = '{"version": 1, "runs": []}'
    monkeypatch.setattr("sys.stdin", io.StringIO(batch))
    got = sequence.parse_args(["--node-dir", "/nd", command] + argv_of(SEQUENCE_VALUES[command]))
    extra = {"batch": batch} if command == "stage" else {}
    whole = dict(SEQUENCE_VALUES[command], node_dir="/nd", command=command, **extra)
    assert got == sequence.parse_args([cli.SPEC_FLAG, json.dumps(whole)])
    assert got == (command, sequence.SPECS[command](node_dir="/nd", **SEQUENCE_VALUES[command], **extra))


def required_cases() -> list:
    cases = [(tool, [], name) for tool in sorted(VALUES) for name, d in field_defaults(TOOLS[tool][1]).items()
             if d == REQUIRED]
    return cases + [("sequence", ["--node-dir", "/nd", command], name) for command in sorted(SEQUENCE_VALUES)
                    for name, d in field_defaults(sequence.SPECS[command]).items()
                    if d == REQUIRED and name in SEQUENCE_VALUES[command]]


@pytest.mark.parametrize("tool, before, name", required_cases())
def test_a_missing_required_flag_exits_2_naming_it(tool: str, before: list, name: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if tool == "sequence":
        parse_args, values = sequence.parse_args, SEQUENCE_VALUES[before[-1]]
    else:
        parse_args, values = TOOLS[tool][0], VALUES[tool]
    with pytest.raises(SystemExit) as got:
        parse_args(before + argv_of({k: v for k, v in values.items() if k != name}))
    assert got.value.code == 2
    assert "the following arguments are required: --" + name.replace("_", "-") in capsys.readouterr().err
