"""A resume's fingerprint check (specab/driver/session.py ``check_fingerprint``) on a store written before a key
existed: the real H200 sweep's store, recorded before ``bench.ignore_eos`` was added, against the current experiment
file. Nothing touches a node: the check runs on the store and the prepared experiment, as ``--resume`` does first."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from specab.driver.options import ExperimentError, Options, prepare
from specab.driver.session import check_fingerprint
from specab.results.store import Store
from tests.stores import copy_store

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "tests/fixtures/known-truth/h200/known-truth-h200-20261204-055428"
EXPERIMENT = REPO / "experiments/known-truth-h200.yml"
INVENTORY = REPO / "inventory/gpu-real-sglang.yml"


def _check(tmp_path: Path, experiment: Path, *, force: bool = False) -> tuple[bool, str]:
    store = Store.open(copy_store(STORE, tmp_path / STORE.name))
    try:
        assert "ignore_eos" not in store.fingerprint()[1]["bench"]      # written before the key existed
        row = store.experiment()
        prepared = prepare(Options(experiment_file=str(experiment), inventory_file=str(INVENTORY),
                                   matrix=list(row["matrix"]), repeats=row["repeats"], seed=row["seed"],
                                   order=row["order_mode"], skip_invalid=True))        # as --resume prepares it
        out = io.StringIO()
        return check_fingerprint(store, prepared, force=force, out=out), out.getvalue()
    finally:
        store.close()


def test_a_store_written_before_ignore_eos_resumes_under_its_default(tmp_path: Path) -> None:
    """Also the guard for the next key: one added to the fingerprint document without an entry in
    ``fingerprint.LATER_KEYS`` fails here, the refusal naming it."""
    assert "ignore_eos" not in EXPERIMENT.read_text()          # the default (true): the runs' forced lengths
    assert _check(tmp_path, EXPERIMENT) == (False, "")


def test_a_store_written_before_ignore_eos_refuses_another_value_and_names_the_key(tmp_path: Path) -> None:
    natural = tmp_path / "known-truth-h200.yml"
    natural.write_text(EXPERIMENT.read_text().replace("  bench:\n", "  bench:\n    ignore_eos: false\n", 1))
    assert "ignore_eos: false" in natural.read_text()
    with pytest.raises(ExperimentError, match=r"Changed:\n  bench\.ignore_eos: \(absent\) -> false\nRestore") as exc:
        _check(tmp_path, natural)
    assert "--force-changed" in str(exc.value)
    forced, said = _check(tmp_path / "forced", natural, force=True)
    assert forced and "changed: bench.ignore_eos: (absent) -> false" in said
