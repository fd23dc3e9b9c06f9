"""Several experiments' stores read as one: the blocks of comparable runs made on different days or machine leases
pooled into one verdict (`driver.py report A --with B --with C`).

A paired speedup compares an arm with its baseline within a block, so a block from another store is one more
paired observation as long as both stores ran the same arm and the same baseline: **comparability is checked by
content**, not by name. An arm that two stores share must have the same fingerprint in both (its resolved server
args and env, the bench settings its runs ran under, the timeouts: ``fingerprint.arm_fingerprint``); a store
without a fingerprint (written before they existed) cannot be checked and is refused, as is a store with
other common settings than the first's (model, common server args and env, bench settings, timeouts). Arms that
only one store has are kept: a sweep's loads 1-8 from one store and 16-32 from another make one curve.

The combined experiment's blocks are each store's blocks after the previous stores' (block 1 of the second store
becomes block n+1), its runs ``<store tag>/<run id>`` (the tag is the store id's date and time where it ends in
one) in the order they ran; the interval over blocks then includes whatever differs between the stores' days or
machines, which is what a verdict pooled over them has to carry.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from specab.analysis.evidence.model import AnalysisError, Experiment, load_store
from specab.config.fingerprint import arm_fingerprint, changes
from specab.results.store import Store

_STAMP = re.compile(r"(\d{8}-\d{6})$")


def tag(experiment_id: str) -> str:
    """A short name for a store's runs: its id's trailing date and time, else the id."""
    m = _STAMP.search(experiment_id)
    return m.group(1) if m else experiment_id


def _fingerprint_doc(path: Path, exp_id: str) -> dict:
    """The store's fingerprint document (specab.config.fingerprint); refused for a store without one."""
    store = Store.open(path / "results.sqlite" if path.is_dir() else path)
    try:
        fp = store.fingerprint()
    finally:
        store.close()
    if fp is None:
        raise AnalysisError(f"{exp_id}: its store has no fingerprint (written before specab recorded them), so "
                            f"whether its arms are the others' cannot be checked; report it on its own.")
    return fp[1]


def _check_comparable(exps: list[Experiment], docs: list[dict]) -> None:
    """Refuses a store whose common settings are not the first's, or whose arm of a name another store has is not
    that arm by content."""
    common = [{k: v for k, v in d.items() if k != "arms"} for d in docs]
    seen: dict[str, tuple[str, str, dict]] = {}     # arm -> (the first store that has it, its fingerprint, doc)
    for e, doc, own in zip(exps, docs, common):
        if changes(common[0], own):
            raise AnalysisError(f"{e.id} is not the experiment {exps[0].id} with other arms: "
                                f"{'; '.join(changes(common[0], own)[:6])}. Pool only stores of the same experiment "
                                f"(model, common server args and env, bench settings, timeouts).")
        for name in doc.get("arms") or {}:
            fp = arm_fingerprint(doc, name)
            if name not in seen:
                seen[name] = (e.id, fp, doc)
                continue
            first_id, first_fp, first_doc = seen[name]
            if fp != first_fp:
                diff = [c for c in changes(first_doc, doc) if not c.startswith("arms.") or c.startswith(f"arms.{name}.")]
                raise AnalysisError(f"arm {name} of {e.id} is not the arm {name} of {first_id}: "
                                    f"{'; '.join(diff[:6]) or 'their contents differ'}. Pool only runs of the same "
                                    f"arms (same server args, env, bench settings and timeouts).")


def combine(paths: list[Path], *, read_logs: bool = True) -> Experiment:
    """The experiments at ``paths`` (directories or stores) as one; the first names it. Raises AnalysisError when
    an arm two of them share differs in content, or when one's common settings are not the first's."""
    if len(paths) < 2:
        raise AnalysisError("combine needs two or more experiments")
    exps = [load_store(p, read_logs=read_logs) for p in paths]
    ids = [e.id for e in exps]
    if len(set(ids)) != len(ids):
        raise AnalysisError(f"the same experiment was given twice ({', '.join(ids)}): each store counts once")
    _check_comparable(exps, [_fingerprint_doc(Path(p), e.id) for p, e in zip(paths, exps)])
    arms, names = [], set()
    runs, offset, seq = [], 0, 0
    fps: dict[str, str] = {}
    sources: dict[int, tuple[Path | None, int]] = {}     # seq -> (the store it is read from, its seq there)
    for e in exps:
        for a in e.arms:
            if a.name not in names:
                names.add(a.name)
                arms.append(a)
        t = tag(e.id)
        # a store whose own runs ran under several fingerprints (a resume under --force-changed) keeps saying so;
        # between the stores the arms were compared above
        own = e.meta.get("run_fingerprints") or {}
        mixed = len(set(own.values())) > 1
        for r in sorted(e.runs, key=lambda r: r.seq):
            seq += 1
            rid = f"{t}/{r.run_id}"
            if mixed and r.run_id in own:
                fps[rid] = own[r.run_id]
            runs.append(dataclasses.replace(r, run_id=rid, seq=seq, block=r.block + offset))
            sources[seq] = (e.root / "results.sqlite" if e.root else None, r.seq)
        offset += max((r.block for r in e.runs), default=0)
    first = exps[0]
    return Experiment(id=" + ".join(ids), arms=arms, runs=runs,
                      order="interleaved" if all(e.order == "interleaved" for e in exps) else "blocked",
                      baseline=first.baseline, name=first.name, root=first.root,
                      meta={**first.meta, "combined": ids, "run_fingerprints": fps, "sources": sources,
                            "design_steps": [], "finished": exps[-1].meta.get("finished")},
                      burn_in=[dataclasses.replace(r, run_id=f"{tag(e.id)}/{r.run_id}") for e in exps for r in e.burn_in])
