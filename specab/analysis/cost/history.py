"""The per-node history of experiments: what an earlier experiment on a node measured, as the design's
starting point for the next one with the same fingerprint (docs/statistics.md, "Design by cost").

One JSON-lines file per node under the runs directory, `<runs>/history/<host>.jsonl`, one line per experiment
that ended (appended by the driver when it concludes an experiment). A line holds the experiment's fingerprint
(specab.config.fingerprint: the model, the common and per-arm server args and env, the bench settings and the
timeouts, secrets redacted) and, per compared arm, the variance components of its paired log ratio against its
baseline (specab.analysis.cost.economics.components_of) with their degrees of freedom, the mean GPU-seconds of its
runs, and the pair's own fingerprint (`pair`: the arm and its baseline by content, not by name). **An arm of a
line matches** a planned experiment on the same host when the line's fingerprint is the planned one (the same
experiment again), or when its pair fingerprint is one of the planned pairs (the same arm against the same
baseline with the same benchmark, under any name and in any experiment: a `--matrix steps=1,2,3` sweep is the
prior of a later `--target-ci` run of one of its arms). The engine's build is not in a fingerprint (it is not
known before a run); a node whose engine was upgraded keeps its history until the experiment file changes.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from specab.analysis.cost import design, economics
from specab.analysis.evidence.model import Experiment
from specab.config.fingerprint import pair_fingerprints

DIRNAME = "history"


class HistoryError(ValueError):
    """A history file that cannot be read; the message names the file and the line."""


def path_for(runs_dir: Path, host: str) -> Path:
    """The node's history file (the host name made safe for a file name)."""
    return Path(runs_dir) / DIRNAME / (re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".jsonl")


def entries_of(exp: Experiment, fingerprint: str, pairs: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """One history line per host of the experiment: per compared arm its components, mean GPU-seconds and (from
    ``pairs``, arm -> pair fingerprint) its pair fingerprint.

    An arm with fewer than two complete blocks on a host has no between-instance estimate and is left out;
    a host with no such arm gets no line."""
    out: dict[str, dict[str, Any]] = {}
    for host in exp.hosts:
        sub = Experiment(id=exp.id, arms=exp.arms, runs=[r for r in exp.runs if r.host == host], order=exp.order)
        arms: dict[str, Any] = {}
        for arm in sub.spec_arms:
            base_blocks = {r.block for r in sub.runs_of(sub.baseline_of(arm.name)) if r.tok_s}
            blocks = len({r.block for r in sub.runs_of(arm.name) if r.tok_s} & base_blocks)
            if blocks < 2:
                continue
            try:
                c = economics.components_of(sub, arm.name)
            except design.DesignError:
                continue
            runs = [r for r in sub.runs_of(arm.name) + sub.runs_of(sub.baseline_of(arm.name))
                    if r.gpu_seconds is not None]
            mc, measured = economics.measured_cost_runs(sub, {arm.name, sub.baseline_of(arm.name)})
            arms[arm.name] = {"baseline": sub.baseline_of(arm.name), "components": c.to_dict(),
                              "blocks": blocks,
                              "gpu_s_per_run": (sum(r.gpu_seconds for r in runs) / len(runs)) if runs else None,
                              # the run cost measured (the arm's and its baseline's ok runs): the next plan's
                              "cost": None if mc is None else {"restart_s": mc.load_s, "per_request_s": mc.per_request_s,
                                                               "gpus": mc.gpus, "runs": measured}}
            if pairs and arm.name in pairs:
                arms[arm.name]["pair"] = pairs[arm.name]
        if arms:
            out[host] = {"fingerprint": fingerprint, "experiment": exp.id, "host": host,
                         "ended_at": time.time(), "arms": arms}
    return out


def record(runs_dir: Path, exp: Experiment, fingerprint: str, doc: dict[str, Any] | None = None) -> list[Path]:
    """Append the experiment's lines to the history of every node it ran on; returns the files written. With the
    fingerprint's document each compared arm also carries its pair fingerprint."""
    pairs = pair_fingerprints(doc, {a.name: exp.baseline_of(a.name) for a in exp.spec_arms}) if doc else None
    written = []
    for host, entry in entries_of(exp, fingerprint, pairs=pairs).items():
        p = path_for(runs_dir, host)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
        written.append(p)
    return written


def read(runs_dir: Path, host: str) -> list[dict[str, Any]]:
    """Every line of the node's history, oldest first ([] when the node has none)."""
    p = path_for(runs_dir, host)
    if not p.exists():
        return []
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise HistoryError(f"{p}:{i}: not a JSON line ({exc}); delete or fix the line (the history is only "
                               f"the design's starting point, no result depends on it)") from None
    return out


def _matching(runs_dir: Path, host: str, fingerprint: str, pairs: Iterable[str]
              ) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(line, arm name, arm entry) of every arm of the node's history that matches: its line's fingerprint is
    ``fingerprint`` or its pair fingerprint is one of ``pairs``. An experiment concluded twice (a resume with
    nothing left to run) counts once, by its last line."""
    wanted = set(pairs)
    latest = {e.get("experiment"): e for e in read(runs_dir, host)}
    return [(e, name, a) for e in latest.values() for name, a in (e.get("arms") or {}).items()
            if e.get("fingerprint") == fingerprint or a.get("pair") in wanted]


def _source(host: str, fingerprint: str, matched: list[tuple[dict[str, Any], str, dict[str, Any]]], what: str,
            name_fingerprint: bool = True) -> str:
    """Which earlier experiments the prior or the cost comes from: by the experiment's fingerprint, else by the
    arms whose pair matched (named as they were in their experiment)."""
    same = {e.get("experiment") for e, _, _ in matched if e.get("fingerprint") == fingerprint}
    other = sorted({f"{name} of {e.get('experiment')}" for e, name, _ in matched
                    if e.get("fingerprint") != fingerprint})
    parts = [f"{len(same)} earlier experiment(s)" + (f" with fingerprint {fingerprint}" if name_fingerprint else "")
             ] if same else []
    if other:
        parts.append("the same arm and baseline in " + ", ".join(other))
    return f"history of {host}: " + " and ".join(parts) + what


def prior(runs_dir: Path, host: str, fingerprint: str, pairs: Iterable[str] = ()) -> design.Components | None:
    """The design's prior from the node's matching history (see the module text for what matches): every matching
    arm's components, pooled by degrees of freedom (the noisiest arm's between-instance variance counts as much as
    its blocks say), the between-instance variance also with the default one (design.DEFAULT_BETWEEN, its
    DEFAULT_BETWEEN_DF degrees of freedom), as the design pools its own blocks with a prior: two blocks that happened
    to agree (an estimate of 0 from one degree of freedom) do not promise a node without instance noise, and the
    plan's range stays open. None when nothing matches."""
    matched = [(e, n, a) for e, n, a in _matching(runs_dir, host, fingerprint, pairs)
               if isinstance(a.get("components"), dict) and all(
                   isinstance(a["components"].get(k), (int, float)) and math.isfinite(a["components"][k])
                   for k in ("between", "within", "between_df", "within_df"))]
    if not matched:
        return None
    comps = [a["components"] for _, _, a in matched]
    b_df = sum(c["between_df"] for c in comps) + design.DEFAULT_BETWEEN_DF
    w_df = sum(c["within_df"] for c in comps)
    between = (sum(c["between"] * c["between_df"] for c in comps)
               + design.DEFAULT_BETWEEN * design.DEFAULT_BETWEEN_DF) / b_df
    within = sum(c["within"] * c["within_df"] for c in comps) / w_df if w_df > 0 else 0.0
    return replace(design.Components(between=between, within=within, between_df=b_df, within_df=w_df),
                   source=_source(host, fingerprint, matched, " (its between-instance variance pooled with the "
                                                                 "default's)"))


def run_cost(runs_dir: Path, host: str, fingerprint: str, pairs: Iterable[str] = ()) -> design.RunCost | None:
    """The run cost the node's matching history measured: a restart's seconds (everything a run held its GPUs for
    but its measured requests: stop, GPUs-free wait, start, load, warm-up, env check, collect) and a measured
    request's seconds, averaged over the matching arms' runs. None when no matching arm has a measured cost
    (lines written before 2026-12 have none)."""
    matched = [(e, n, a) for e, n, a in _matching(runs_dir, host, fingerprint, pairs) if isinstance(a.get("cost"), dict)
               and all(isinstance(a["cost"].get(k), (int, float)) and math.isfinite(a["cost"][k]) and a["cost"][k] >= 0
                       for k in ("restart_s", "per_request_s", "gpus", "runs")) and a["cost"]["runs"] > 0]
    if not matched:
        return None
    rows = [a["cost"] for _, _, a in matched]
    n = sum(c["runs"] for c in rows)
    return design.RunCost(load_s=sum(c["restart_s"] * c["runs"] for c in rows) / n,
                          per_request_s=max(sum(c["per_request_s"] * c["runs"] for c in rows) / n, 1e-3),
                          gpus=max(int(c["gpus"]) for c in rows),
                          source=_source(host, fingerprint, matched, f", {n} runs measured", name_fingerprint=False))
