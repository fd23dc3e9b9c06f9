"""Provenance diff: what differs between two runs' manifests ("why did 94 become 60?").

`python driver.py diff <run-a> <run-b>` where a run is a run directory (holding manifest.json), a
manifest.json file, or `<experiment>/<run-id-or-seq>` (experiment id under the runs directory or
its path; read from the run directory or else from the results store). Differences are grouped
into factors: engine (the build, the version its server reported, its SGLang generation and `--help`
fingerprint), engine args, env (the env file and the server's environment are one factor per
variable), versions, GPUs (UUIDs, names, max clocks, power limits), models (paths, checksums),
dataset, seed, host. Values that change on every run (timestamps, run ids, pids, current clocks,
the launch script that is rendered from args+env) are left out unless --all. Secret values are
never printed.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TextIO

from specab.analysis.subcommand import standalone_main
from specab.results.locate import default_runs_dir
from specab.results.store import FILENAME, Store
from specab.vocab.contract import REDACTED, is_secret_name, redact_mapping, redact_text

CATEGORY_ORDER = ("engine", "engine args", "env", "versions", "gpu", "models", "dataset", "seed", "host", "bench",
                  "timeouts", "experiment", "other", "volatile")


class ProvenanceError(ValueError):
    """A run or manifest that cannot be found or read; the message says where we looked."""


@dataclass
class Difference:
    category: str
    key: str
    a: Any
    b: Any
    sources: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"category": self.category, "key": self.key, "a": self.a, "b": self.b, "sources": list(self.sources)}


# ------------------------------------------------------------------------------------------ flatten

_VOLATILE = [re.compile(p) for p in (
    r"^created_at", r"^run_dir$", r"^run_id$", r"^kind$", r"^timestamps\.", r"^server\.record\.",
    r"^launch\.", r"^server\.environ_error$", r"^extra\.(started|finished|run_id|seq|block)",
    r"^gpu\.gpus\[[^\]]+\]\.(clocks\.sm|clocks\.mem|power\.draw|temperature\.gpu|utilization\.gpu|"
    r"memory\.used|pstate|clocks_event_reasons\.active)$",
    r"^env_file\.path$", r"^versions\.python_for_engine$",
    r"^extra\.(experiment_id|run_id|arm|inventory_hostname|seq|block)$", r"^extra\.\w+_s$",
    r"\.(PWD|OLDPWD|SHLVL|_|INVOCATION_ID|JOURNAL_STREAM|SPECAB_SIM_STATE)$",
)]


def _category(key: str) -> tuple[str, str]:
    """(category, factor key) of a flattened manifest key."""
    if any(p.search(key) for p in _VOLATILE):
        return "volatile", key
    for prefix in ("env_file.values.", "server.environ.", "env."):
        if key.startswith(prefix):
            return "env", key[len(prefix):]
    if key in ("extra.specab_git", "extra.ansible_version", "extra.git_sha"):
        return "versions", key.split(".", 1)[1]
    for prefix, cat in (("engine.", "engine"), ("server_args.", "engine args"), ("engine_args.", "engine args"), ("versions.", "versions"),
                        ("gpu.", "gpu"), ("models.", "models"), ("dataset", "dataset"), ("extra.dataset", "dataset"),
                        ("bench.", "bench"), ("host.", "host")):
        if key.startswith(prefix):
            return cat, key[len(prefix):] if cat in ("engine", "engine args", "versions", "gpu", "models", "host", "bench") else key
    if key in ("seed", "extra.seed", "bench.seed"):
        return "seed", "seed"
    if key.startswith("timeouts."):       # the experiment's timeouts (stamped by the driver)
        return "timeouts", key[len("timeouts."):]
    if key == "fingerprint":
        return "experiment", key
    return "other", key


def _redact(key: str, v: Any) -> Any:
    leaf = re.split(r"[.\[\]]", key.rstrip("]"))[-1] if key else key
    if is_secret_name(leaf) and v not in (None, ""):
        return REDACTED
    if isinstance(v, str):
        return redact_text(v)
    return v


_ABSENT = "<absent>"


def _as_tree(v: Any) -> Any:
    """Lists of dicts (GPUs) become dicts keyed by `[index]` so both sides line up by position."""
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return {f"[{x.get('index', i)}]": x for i, x in enumerate(v)}
    return v


def _walk(a: Any, b: Any, key: str, out: list[tuple[str, Any, Any]]) -> None:
    a, b = _as_tree(a), _as_tree(b)
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{key}{k}" if str(k).startswith("[") else (f"{key}.{k}" if key else str(k))
            _walk(a.get(k, _ABSENT), b.get(k, _ABSENT), sub, out)
    elif a != b:
        out.append((key, a, b))       # a whole subtree present on one side only is one difference


def diff_manifests(a: dict, b: dict, include_volatile: bool = False) -> list[Difference]:
    raw: list[tuple[str, Any, Any]] = []
    _walk(a, b, "", raw)
    merged: dict[tuple[str, str], Difference] = {}
    for key, va, vb in raw:
        cat, factor = _category(key)
        if cat == "volatile" and not include_volatile:
            continue
        ra, rb = _redact(key, va), _redact(key, vb)
        if isinstance(va, dict) or isinstance(vb, dict):
            ra = redact_mapping(va) if isinstance(va, dict) else ra
            rb = redact_mapping(vb) if isinstance(vb, dict) else rb
        if ra == rb and ra == REDACTED:
            ra, rb = REDACTED + " (value 1)", REDACTED + " (value 2)"
        mk = (cat, factor)
        if mk in merged:
            merged[mk].sources += (key,)
        else:
            merged[mk] = Difference(cat, factor, ra, rb, (key,))
    return sorted(merged.values(), key=lambda d: (CATEGORY_ORDER.index(d.category), d.key))


# ------------------------------------------------------------------------------------------ locate runs

def _read_manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ProvenanceError(f"{path}: not valid JSON ({e})") from e


def load_manifest(ref: str, runs_dir: str | Path | None = None) -> tuple[str, dict]:
    """(label, manifest) for a run reference (see module doc)."""
    p = Path(ref)
    if p.is_file():
        return str(p), _read_manifest(p)
    if p.is_dir() and (p / "manifest.json").is_file():
        return str(p), _read_manifest(p / "manifest.json")
    base = Path(runs_dir) if runs_dir else default_runs_dir()
    exp_part, _, run_part = ref.rstrip("/").rpartition("/")
    if not exp_part:
        raise ProvenanceError(f"run {ref!r} not found: give a run directory, a manifest.json, or "
                              f"<experiment>/<run-id> (e.g. default-20250101-120000/003-eagle3-s2)")
    for exp_dir in (Path(exp_part), base / exp_part):
        if not exp_dir.is_dir():
            continue
        cands = [exp_dir / run_part] + sorted(exp_dir.glob(f"{int(run_part):03d}-*") if run_part.isdigit() else [])
        for c in cands:
            if (c / "manifest.json").is_file():
                return str(c), _read_manifest(c / "manifest.json")
        if (exp_dir / FILENAME).exists():
            st = Store.open(exp_dir / FILENAME)
            try:
                rows = st.runs()
                runs = {r["seq"]: r["run_id"] for r in rows}
                heads = {r["seq"]: str(r.get("host") or "").split(",")[0] for r in rows}
                found = [m for m in st.manifests()
                         if str(m["seq"]) == run_part.lstrip("0") or runs.get(m["seq"]) == run_part]
                # a multi-node run also stores its other ranks' manifests: the run's is its head's
                found.sort(key=lambda m: m["host"] != heads.get(m["seq"]))
                if found:
                    m = found[0]
                    return f"{exp_dir.name}/{runs.get(m['seq'], m['seq'])}", m["manifest"]
            finally:
                st.close()
    raise ProvenanceError(f"run {ref!r} not found: no {run_part}/manifest.json under {exp_part} or {base / exp_part}, "
                          f"and no manifest for it in the experiment's results store")


# ------------------------------------------------------------------------------------------ output

def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def render_text(label_a: str, label_b: str, diffs: list[Difference]) -> str:
    if not diffs:
        return f"no differences between {label_a} and {label_b} (volatile fields ignored; --all shows them)"
    out = [f"a: {label_a}", f"b: {label_b}", f"{len(diffs)} difference(s):"]
    cat = None
    for d in diffs:
        if d.category != cat:
            cat = d.category
            out.append(f"{cat}:")
        out.append(f"  {d.key}: {_show(d.a)} -> {_show(d.b)}")
    return "\n".join(out)


def cmd_diff(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        la, ma = load_manifest(ns.run_a, ns.runs_dir)
        lb, mb = load_manifest(ns.run_b, ns.runs_dir)
    except ProvenanceError as e:
        print(f"specab diff: {e}", file=out)
        return 2
    diffs = diff_manifests(ma, mb, include_volatile=ns.all)
    if ns.format == "json":
        print(json.dumps({"a": la, "b": lb, "differences": [d.to_dict() for d in diffs]}, indent=2), file=out)
    else:
        print(render_text(la, lb, diffs), file=out)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("diff", help="what differs between two runs' manifests",
                              description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("run_a", help="run directory, manifest.json, or <experiment>/<run-id-or-seq>")
    p.add_argument("run_b")
    p.add_argument("--runs-dir", help="where experiments live (default: the driver's runs directory)")
    p.add_argument("--all", action="store_true", help="also show fields that change on every run")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_diff)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return standalone_main(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
