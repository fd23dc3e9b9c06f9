"""SGLang 0.5.23's OWN argument parser on the command lines specab renders for it: the real package from
the registry (scripts/install_sglang_parser.sh, its own ~2.2 GB venv) runs `ServerArgs.add_cli_args` + `parse_args` on
every arm of `experiments/default.yml --matrix steps=1,2,3 --matrix cuda_graph_max_bs=16` and of an arm that
disables CUDA graphs, spelled for the node by specab's engine knowledge from the real 0.5.23 `--help` (as the
driver does before launching). Each must parse (no exit 2) to the values intended; the 0.5.9 spelling of the same
arm must be refused exactly as a user on 0.5.23 meets it (`ambiguous option: --cuda-graph-max-bs`).

SGLang cannot serve on these CPUs (shared/facts/real-engines-on-cpu.md); its parser is what a launch meets first.
Marked `real_engine`; skipped where the venv is absent (make sglang-parser), unless SPECAB_REQUIRE_REAL_SGLANG=1."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from specab.driver import preflight
from specab.driver.options import Options, prepare
from specab.vocab import engines
from tests.launch_argv import argv_of

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPECAB_SGLANG_VENV", str(Path.home() / ".cache/specab/sglang-0.5.23")))
HELP_0523 = REPO / "specab" / "sim" / "data" / "sglang-0.5.23-help.txt"     # the real 0.5.23 --help
FLAGS_059 = REPO / "specab" / "sim" / "data" / "sglang-0.5.9-flags.txt"

# One interpreter parses every command line (importing sglang takes seconds): argv lists in, results out.
PARSE = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.load(sys.stdin):
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
        out.append({"rc": 0, "values": {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, list, type(None)))}})
    except SystemExit as exc:
        out.append({"rc": exc.code, "error": err.getvalue().strip().splitlines()[-1:]})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    python = VENV / "bin" / "python"
    if not ((VENV / ".specab-installed").is_file() and python.is_file()):
        why = f"no SGLang 0.5.23 parser venv at {VENV}; run `make sglang-parser` (~2.2 GB, minutes)"
        if os.environ.get("SPECAB_REQUIRE_REAL_SGLANG") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return python


def parse(python: Path, argvs: list[list[str]]) -> list[dict]:
    proc = subprocess.run([str(python), "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def flags(path: Path) -> preflight.EngineFlags:
    text = path.read_text()
    fs = preflight.parse_help_flags(text) if "usage:" in text else {ln.strip() for ln in text.splitlines()
                                                                  if ln.startswith("--")}
    return preflight.EngineFlags("node", ("python3", "-m", "sglang.launch_server"), None, frozenset(fs))


def test_sglang_0523_parses_every_arm_as_specab_spells_it(sglang_python: Path) -> None:
    p = prepare(Options(experiment_file=str(REPO / "experiments" / "default.yml"),
                        matrix=["steps=1,2,3", "cuda_graph_max_bs=16"]))
    no_graph = prepare(Options(experiment_file=str(REPO / "experiments" / "default.yml"),
                               matrix=["disable_cuda_graph=true"]))
    arms = p.arms + no_graph.arms
    ef = flags(HELP_0523)
    assert engines.generation_of_flags(ef.flags) == engines.SGLANG_0_5_23
    assert preflight.unknown_flags(arms, ef) == []
    spelt = preflight.spell_arms(arms, [ef])
    argvs = [argv_of(a.node_args) for a in spelt]
    results = parse(sglang_python, argvs)
    for arm, argv, res in zip(spelt, argvs, results):
        assert res["rc"] == 0, (arm.name, argv, res)
        got = res["values"]
        for key, value in arm.node_args.items():
            if value is None or value is False:
                continue
            want = [str(v) for v in value] if isinstance(value, list) else value
            have = [str(v) for v in got[key]] if isinstance(got[key], list) else got[key]
            assert have == want or str(have) == str(want), (arm.name, key, have, want)
    by = {a.name: a for a in spelt}
    # the logical names became 0.5.23's own: per-phase graph settings, and SGLang parsed them as such
    graphed = next(a for a in spelt if a.name.startswith("eagle3-s2") and "cuda_graph_max_bs" in a.server_args)
    assert graphed.node_args["cuda_graph_max_bs_decode"] == 16 and "cuda_graph_max_bs" not in graphed.node_args
    off = by["baseline-disable_cuda_graph-true"]
    assert off.node_args["cuda_graph_backend_decode"] == "disabled"
    print("SGLang 0.5.23 parsed %d command lines: %s" % (len(argvs), ", ".join(a.name for a in spelt)))


def test_the_0_5_9_spelling_is_refused_by_0_5_23_as_users_meet_it(sglang_python: Path) -> None:
    p = prepare(Options(experiment_file=str(REPO / "experiments" / "default.yml"), matrix=["cuda_graph_max_bs=16"]))
    old = preflight.spell_arms(p.arms[:1], [flags(FLAGS_059)])[0]
    assert old.node_args["cuda_graph_max_bs"] == 16
    (res,) = parse(sglang_python, [argv_of(old.node_args)])
    assert res["rc"] == 2 and "ambiguous option: --cuda-graph-max-bs could match" in res["error"][0], res
    # and specab refuses it before any launch when the node's --help is 0.5.23's: it spells it instead
    assert preflight.unknown_flags(p.arms[:1], flags(HELP_0523)) == []
