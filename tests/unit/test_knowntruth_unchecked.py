"""A known-truth check that cannot run is a finding that names the file, never a check that disappears: a
known_truth.json the benchmark client cannot use (unreadable, not JSON, not a known-truth model's), a speculative
run whose draft has no truth, a pooled store that is gone. The client names the file in the summary
(``known_truth_problems``), the analysis lists the runs as unchecked (``truthcheck.TruthReport.unchecked``), the
doctor warns (``known-truth-unchecked``) and the report's Known truth section says which runs were not checked."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from specab.analysis.evidence import combine, model
from specab.analysis.findings import doctor
from specab.analysis.measures import truthcheck
from specab.analysis.render import report
from specab.node import loadgen
from tests.stores import copy_store

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "known-truth" / "h200"
MAIN = FIX / "known-truth-h200-20261204-055428"        # baseline vs EAGLE-3 p 0.9, steps 1-3, 2 blocks
LATER = FIX / "known-truth-h200-20261205-121517"       # the same experiment, one block on the next day
SPEC_RUN = "003-eagle3-s3-k1-d4"
TARGET = {"vocab_size": 14, "first": 4, "rule": "t+1", "role": "target"}


def _models(tmp_path: Path, target: str | None, draft: str | None, spec: bool = True) -> Path:
    """A run directory whose args.json serves a target (and a draft) folder holding the given known_truth.json
    texts (None: no file)."""
    run = tmp_path / "run"
    run.mkdir()
    for name, text in (("target", target), ("draft", draft)):
        (tmp_path / name).mkdir()
        if text is not None:
            (tmp_path / name / "known_truth.json").write_text(text)
    args = {"model_path": str(tmp_path / "target")}
    if spec:
        args |= {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(tmp_path / "draft"),
                 "speculative_num_steps": 3}
    (run / "args.json").write_text(json.dumps(args))
    return run


@pytest.mark.parametrize("text,why", [("{not json", "cannot be read as JSON"),
                                      (json.dumps({**TARGET, "rule": "t*2"}), "not a known-truth model's file (rule 't*2'"),
                                      ("[1, 2]", "not a known-truth model's file (not a JSON object)"),
                                      (json.dumps({"rule": "t+1", "first": 4}), "needs integer 'vocab_size'")])
def test_a_target_s_unusable_known_truth_json_is_named_by_the_client(tmp_path: Path, text: str, why: str) -> None:
    kt, problems = loadgen.known_truth_of(str(_models(tmp_path, text, None, spec=False)))
    assert kt is None and len(problems) == 1
    assert problems[0].startswith(f"{tmp_path / 'target' / 'known_truth.json'}: {why}"), problems


def test_a_draft_without_truth_is_named_by_the_client(tmp_path: Path) -> None:
    kt, problems = loadgen.known_truth_of(str(_models(tmp_path, json.dumps(TARGET), None)))
    assert kt is not None and kt["draft"] is None
    assert problems == [f"{tmp_path / 'draft' / 'known_truth.json'}: no such file: the run speculates (EAGLE3) on a "
                        f"known-truth target, but its draft has no truth, so its cycles cannot be checked"]
    # a draft file that is there but broken is named for what is wrong with it, once
    (tmp_path / "x").mkdir()
    kt, problems = loadgen.known_truth_of(str(_models(tmp_path / "x", json.dumps(TARGET), "{")))
    assert len(problems) == 1 and problems[0].startswith(f"{tmp_path / 'x' / 'draft' / 'known_truth.json'}: cannot")
    # a model without known_truth.json is no known-truth model: nothing to check, nothing to say
    (tmp_path / "y").mkdir()
    assert loadgen.known_truth_of(str(_models(tmp_path / "y", None, None))) == (None, [])


def _set_summary(d: Path, run_id: str, change) -> None:
    with sqlite3.connect(d / "results.sqlite") as c:
        (raw,) = c.execute("SELECT summary_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        summary = json.loads(raw)
        change(summary)
        c.execute("UPDATE runs SET summary_json = ? WHERE run_id = ?", (json.dumps(summary), run_id))


def _unchecked(e: model.Experiment) -> list[doctor.Finding]:
    return [f for f in doctor.diagnose(e) if f.rule == "known-truth-unchecked"]


def test_a_run_whose_client_could_not_use_the_truth_is_a_warning_naming_the_file(tmp_path: Path) -> None:
    d = copy_store(MAIN, tmp_path / "main")
    bad = "/models/kt/eagle3/known_truth.json: cannot be read as JSON (Expecting value: line 1 column 1 (char 0))"

    def client_could_not_read(summary: dict) -> None:
        del summary["known_truth"]
        summary["known_truth_problems"] = [bad]
    _set_summary(d, SPEC_RUN, client_could_not_read)
    e = model.load_store(d)
    [f] = [f for f in doctor.diagnose(e) if f.rule == "known-truth-unchecked"]
    assert f.severity == "warning" and f.runs == [SPEC_RUN] and f.arm == "eagle3-s3-k1-d4"
    assert bad in f.message and f.evidence == [f"{SPEC_RUN}: {bad}"]
    # the other runs are still checked, exactly
    rep = truthcheck.check(e)
    assert len(rep.runs) == 7 and not rep.problems
    md = report.to_markdown(report.build_report(e, plots=False))
    assert "Not checked: 1 run(s) (" + bad in md


def test_a_speculative_run_recorded_without_its_draft_s_truth_is_named(tmp_path: Path) -> None:
    d = copy_store(MAIN, tmp_path / "main")
    draft = {}

    def no_draft(summary: dict) -> None:
        draft.update(summary["known_truth"]["draft"])
        summary["known_truth"]["draft"] = None
    _set_summary(d, SPEC_RUN, no_draft)
    e = model.load_store(d)
    [f] = _unchecked(e)
    folder = next(r for r in e.runs if r.run_id == SPEC_RUN).server_args["speculative_draft_model_path"]
    assert f.runs == [SPEC_RUN] and f"{folder}/known_truth.json: not recorded" in f.message
    assert "known-truth-mismatch" not in {x.rule for x in doctor.diagnose(e)}


def test_a_pooled_store_that_is_gone_is_named_and_the_rest_still_checked(tmp_path: Path) -> None:
    main, later = copy_store(MAIN, tmp_path / MAIN.name), copy_store(LATER, tmp_path / LATER.name)
    e = combine.combine([main, later])
    (later / "results.sqlite").unlink()
    [f] = _unchecked(e)
    assert f"{later / 'results.sqlite'}: the store these runs were read from is missing" in f.message
    assert f.runs == [r.run_id for r in e.runs if r.run_id.startswith("20261205-121517/")] and len(f.runs) == 4
    rep = truthcheck.check(e)
    assert len(rep.runs) == 8 and all(q.cycles_exact for r in rep.runs if r.steps for q in r.requests)


def test_a_malformed_truth_in_a_run_s_summary_is_named_not_raised(tmp_path: Path) -> None:
    d = copy_store(MAIN, tmp_path / "main")
    _set_summary(d, SPEC_RUN, lambda s: s["known_truth"]["target"].pop("vocab_size"))
    [f] = _unchecked(model.load_store(d))
    assert f.runs == [SPEC_RUN] and "known_truth.target: needs integer 'vocab_size' and 'first'" in f.message
