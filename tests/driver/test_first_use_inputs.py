"""Bad input a new user tries, refused before any node is touched with what was wrong, where and what to do.
Each row: the command line (and the experiment file change), the exit code 2 and the message it now gets."""
from __future__ import annotations

import io
import re
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from specab.driver import cli
from tests.stores import copy_store

REPO = Path(__file__).resolve().parents[2]
DEFAULT = (REPO / "experiments" / "default.yml").read_text()


def experiment(tmp_path: Path, old: str, new: str) -> str:
    assert re.search(old, DEFAULT), old
    f = tmp_path / "exp.yml"
    f.write_text(re.sub(old, new, DEFAULT, count=1))
    return str(f)


def dataset_experiment(tmp_path: Path, content: str) -> str:
    (tmp_path / "data.jsonl").write_text(content)
    return experiment(tmp_path, r"output_len: \d+", "output_len: 64\n    dataset: data.jsonl")


CASES = [
    ("port 99999", lambda t: ["plan", "-e", experiment(t, r"port: \d+", "port: 99999")],
     r"exp.yml:\d+:\d+: server_args.port must be a TCP port number 1-65535, got 99999."),
    ("num_requests 0", lambda t: ["plan", "-e", experiment(t, r"num_requests: \d+", "num_requests: 0")],
     r"exp.yml:\d+:\d+: bench.num_requests must be an integer of at least 1, got 0."),
    ("output_len 0", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+", "output_len: 0")],
     r"bench.output_len must be an integer of at least 1, got 0."),
    ("max_tokens given", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+", "output_len: 64\n    max_tokens: 32")],
     r"exp.yml:\d+:\d+: bench.max_tokens is not a setting: the tokens each request asks for are bench.output_len .* "
     r"Move the value to bench.output_len and remove bench.max_tokens."),
    ("dataset missing", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+", "output_len: 64\n    dataset: nope.jsonl")],
     r"exp.yml:\d+:\d+: bench.dataset: .*/nope.jsonl: cannot read the dataset \(No such file or directory\)"),
    ("dataset empty", lambda t: ["plan", "-e", dataset_experiment(t, "\n\n")],
     r"bench.dataset: .*/data.jsonl: the dataset has no records. Add one JSON object per line"),
    ("dataset malformed line", lambda t: ["plan", "-e", dataset_experiment(t, '{"prompt": "a"}\n\n{"prompt": "b",}\n')],
     r"bench.dataset: .*/data.jsonl:3: not a JSON object .*Each line is one record"),
    ("dataset record without a prompt", lambda t: ["plan", "-e", dataset_experiment(t, '{"text": "a"}\n')],
     r"bench.dataset: .*/data.jsonl:1: a record needs exactly one of \"prompt\" \(text\) or \"messages\""),
    ("dataset of chats on the generate API", lambda t: ["plan", "-e", dataset_experiment(
        t, '{"prompt": "a"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')],
     r"holds chat records \(\"messages\", the first is record 2\) but bench.api is generate: .* Set bench.api: chat"),
    ("ignore_eos not a bool", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+", "output_len: 64\n    ignore_eos: maybe")],
     r"bench.ignore_eos must be true \(every answer runs to output_len\) or false"),
    ("request_rate negative", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+", "output_len: 64\n    request_rate: -2")],
     r"exp.yml:\d+:\d+: bench.request_rate must be a number of requests per second \(0: each as soon as one in flight "
     r"ends\) below 1e\+06, got -2: it is below 0."),
    ("client_procs 0", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+", "output_len: 64\n    client_procs: 0")],
     r"exp.yml:\d+:\d+: bench.client_procs must be auto \(one client process per 8 requests in flight, at most one per "
     r"CPU of the node\) or a whole number of processes >= 1, got 0."),
    ("client_procs a fraction", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+",
                                                                    "output_len: 64\n    client_procs: 2.5")],
     r"exp.yml:\d+:\d+: bench.client_procs must be auto .* got 2.5."),
    ("client_procs a word", lambda t: ["plan", "-e", experiment(t, r"output_len: \d+",
                                                                "output_len: 64\n    client_procs: many")],
     r"exp.yml:\d+:\d+: bench.client_procs must be auto .* got 'many'."),
    ("request_rate 0 in the matrix", lambda t: ["plan", "--matrix", "request_rate=0,4"],
     r"--matrix request_rate: '0' is not a rate of requests per second above 0"),
    ("--repeats 5 --max-repeats 2", lambda t: ["plan", "--repeats", "5", "--max-repeats", "2", "--target-ci", "2%"],
     r"--max-repeats 2 is below --repeats 5: --repeats blocks always run .* Give --max-repeats >= 5"),
    ("-e and -i swapped", lambda t: ["plan", "-e", str(REPO / "inventory" / "local.yml"),
                                     "-i", str(REPO / "experiments" / "default.yml")],
     r"local.yml: this is an inventory \(top-level 'all'\), given as the experiment: were -e and -i swapped\?"),
    ("an experiment as the inventory", lambda t: ["plan", "-i", str(REPO / "experiments" / "default.yml")],
     r"default.yml: this is an experiment file \(top-level 'specab_experiment'\), given as the inventory: were -e "
     r"and -i swapped\?"),
    ("--max-repeats without --target-ci", lambda t: ["plan", "--max-repeats", "4"],
     r"--max-repeats caps the blocks --target-ci adds; without --target-ci .* Drop --max-repeats or add --target-ci."),
]


@pytest.mark.parametrize("name,argv,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_its_message(tmp_path: Path, name: str, argv, message: str) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(argv(tmp_path), out=io.StringIO())
    assert rc == 2 and re.search(message, err.getvalue()), err.getvalue()
    assert "Nothing was started." in err.getvalue()


@pytest.mark.parametrize("under", [False, True], ids=["the file itself", "a folder under it"])
def test_a_runs_dir_that_is_a_file_is_named_as_one(tmp_path: Path, under: bool) -> None:
    f = tmp_path / "runs"
    f.write_text("not a folder")
    target = f / "sub" if under else f
    err = io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(["--repeats", "1", "--runs-dir", str(target)], out=io.StringIO())
    assert rc == 2 and f"{target}: not a directory ({f} is a file)" in err.getvalue(), err.getvalue()
    assert "Pass --runs-dir a directory" in err.getvalue()


def test_a_runaway_matrix_is_capped_with_one_notice_and_a_way_out(tmp_path: Path) -> None:
    """`--matrix steps=1..50`: one grouped notice instead of 49, and `run` refuses 153 runs unless --max-runs allows
    them; `plan` shows them (it starts nothing)."""
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(["--matrix", "steps=1..50", "--runs-dir", str(tmp_path)], out=out)
    assert rc == 2 and "51 arms x 3 blocks = 153 runs, above --max-runs 100" in err.getvalue(), err.getvalue()
    assert "pass --max-runs 153 to run them all" in err.getvalue() and not list(tmp_path.iterdir())
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err):
        assert cli.main(["plan", "--matrix", "steps=1..50"], out=out) == 0
    text = err.getvalue() + out.getvalue()
    notices = [line for line in text.splitlines() if line.startswith("notice:") and "draft_tokens" in line]
    assert len(notices) == 1 and notices[0].startswith("notice: 49 combinations (steps=1, steps=3"), notices
    assert "51 arms x 3 blocks = 153 runs" in text


def test_export_table_is_honoured_in_json_too(tmp_path: Path) -> None:
    import json
    src = REPO / "tests" / "fixtures" / "known-truth" / "h200" / "known-truth-h200-causes-20261204-060246"
    d = copy_store(src, tmp_path / "exp")
    out = io.StringIO()
    assert cli.main(["export", str(d), "--table", "arms"], out=out) == 0
    rows = json.loads(out.getvalue())
    assert [r["name"] for r in rows][:2] == ["baseline", "eagle3-s3"] and all("spec_steps" in r for r in rows)
    out = io.StringIO()
    assert cli.main(["export", str(d)], out=out) == 0
    assert set(json.loads(out.getvalue())) >= {"experiment", "arms", "runs", "requests"}


def test_plan_fleet_shows_each_block_s_host() -> None:
    out = io.StringIO()
    with redirect_stderr(io.StringIO()):
        assert cli.main(["plan", "--fleet", "-i", str(REPO / "inventory" / "example-fleet.yml"), "--repeats", "4"],
                        out=out) == 0
    rows = [line.split() for line in out.getvalue().splitlines() if re.match(r"\s+\d+\s+\d+\s+\d{3}-", line)]
    assert len(rows) == 8 and {r[1]: r[3] for r in rows} == {"1": "gpu-node-1", "2": "gpu-node-2",
                                                             "3": "gpu-node-3", "4": "gpu-node-1"}


def test_a_dataset_is_read_relative_to_the_experiment_and_recorded_absolute(tmp_path: Path) -> None:
    from specab.config.spec import load_experiment
    (tmp_path / "data.jsonl").write_text('{"prompt": "def f():", "category": "code"}\n'
                                         '{"messages": [{"role": "user", "content": "hi"}], "category": "chat"}\n')
    f = experiment(tmp_path, r"api: generate", "api: chat")
    Path(f).write_text(Path(f).read_text().replace("output_len: 256", "output_len: 64\n    dataset: data.jsonl"))
    spec = load_experiment(f)
    assert spec.bench["dataset"] == str(tmp_path / "data.jsonl")
    assert spec.as_extravar()["bench"]["dataset"] == str(tmp_path / "data.jsonl")


@pytest.mark.parametrize("value,message", [
    ("0", r"--matrix concurrency: 0 requests in flight cannot measure anything; every value must be at least 1"),
    ("1,2.5", r"--matrix concurrency: '2.5' is not a whole number of requests in flight; write positive integers"),
    ("1,4,64", r"--matrix concurrency=1,4,64: 64 requests in flight need at least 64 measured requests per run, but "
               r"bench.num_requests is 6 in .*default.yml; .* Set bench.num_requests to 64 or more"),
], ids=["zero", "not an integer", "above num_requests"])
def test_a_bad_concurrency_axis_is_refused_before_any_node_is_touched(tmp_path: Path, value: str, message: str) -> None:
    """A run (not a plan) with a bad load: refused with the value, the rule and what to write, and nothing made
    under --runs-dir (no experiment, no store, no node contact)."""
    err = io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(["--matrix", "steps=1,2", "--matrix", f"concurrency={value}", "--runs-dir", str(tmp_path)],
                      out=io.StringIO())
    assert rc == 2 and re.search(message, err.getvalue()), err.getvalue()
    assert "Nothing was started." in err.getvalue() and not list(tmp_path.iterdir())
