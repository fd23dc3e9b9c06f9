"""Finding an experiment for `driver.py report|show|...`: by its id under the runs directory or by its path, and an
error that names each place looked at, once."""
from __future__ import annotations

from pathlib import Path

import pytest

from specab.results.locate import NotFound, locate
from specab.results.store import FILENAME


def test_an_experiment_is_found_by_id_by_directory_and_by_its_store(tmp_path: Path) -> None:
    exp = tmp_path / "runs" / "default-20261205-090026"
    exp.mkdir(parents=True)
    (exp / FILENAME).write_bytes(b"")
    assert locate("default-20261205-090026", str(tmp_path / "runs")) == exp
    assert locate(str(exp), None) == exp
    assert locate(str(exp / FILENAME), None) == exp


def test_an_unknown_experiment_names_each_place_looked_at_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(NotFound) as got:
        locate("nope", str(runs))
    assert f"no {FILENAME} in nope or {runs / 'nope'}." in str(got.value)
    with pytest.raises(NotFound) as got:
        locate(str(tmp_path), str(runs))              # an absolute path: the runs directory adds no other place
    assert f"no {FILENAME} in {tmp_path}. Give the experiment id (a directory under {runs}) or its path." \
        == str(got.value).split("not found: ")[1]
