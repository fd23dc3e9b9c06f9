"""The experiment fingerprint: a hash of what makes two runs comparable.

The resolved experiment: the model, the common server args and env, every resolved arm (its server args
and env after the experiment's are merged in, and its bench condition when the matrix gave it one, e.g.
``concurrency``), the bench settings and the timeouts (specab's defaults filled in; not ``CLIENT_ONLY``, how the
client spreads its work). Secret values are redacted before hashing (the store and the manifests never hold them; a
changed secret does not change the fingerprint). The engine's build is not known before a run (each run's
manifest records its versions; `driver.py diff` compares them).

A key added to the document after stores were written hashes, while it holds the value that reproduces the
behaviour from before it existed, as if it were absent (``LATER_KEYS``): a store written before ``bench.ignore_eos``
existed ran with forced lengths, so it resumes under the default (true) and its history stays the prior of the same
pair (docs/decisions/0004-fingerprint-keys-added-later.md); another value is a change like any other.

A resume whose fingerprint differs from the experiment's is refused (``changes`` says what changed, as
``bench.num_requests: 2 -> 6``) unless ``--force-changed``; then the store marks each run with the
fingerprint it ran under.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from specab.config.spec import ArmSpec, ExperimentSpec
from specab.vocab.contract import redact_mapping


# bench settings of how the client spreads its own work, not of what the server is asked: the same requests at the
# same schedule whatever their value. Whether the client kept up is judged per run (each summary records its processes
# and the busiest one's CPU; the doctor's client-bottleneck finding), so an experiment rerun with more client processes
# after that finding resumes rather than being refused as another experiment.
CLIENT_ONLY = frozenset({"client_procs"})
# bench settings of the deterministic pass (--correctness) alone: its runs are not measured runs, and its arms are
# not in the document either, so an experiment run with and without --correctness is one experiment (its history
# one prior)
PASS_ONLY = frozenset({"correctness_requests"})


def fingerprint_doc(exp: ExperimentSpec, arms: list[ArmSpec]) -> dict[str, Any]:
    """What the fingerprint hashes (JSON-able, secrets redacted): the measured arms (not the deterministic pass's)."""
    arms = [a for a in arms if a.deterministic_of is None]
    return redact_mapping({
        "model_path": exp.model_path,
        "server_args": dict(exp.server_args),
        "env": dict(exp.env),
        # an arm's bench condition (the matrix's concurrency) only where it has one: the documents of arms without
        # one hash as before it existed
        "arms": {a.name: {"server_args": a.to_json()["server_args"], "env": a.to_json()["env"],
                          **({"bench": dict(a.bench)} if a.bench else {})} for a in arms},
        "bench": {k: v for k, v in exp.bench_settings.items() if k not in CLIENT_ONLY | PASS_ONLY},
        "timeouts": dict(exp.timeout_settings),
    })


# (section, key) -> the value under which the documents written before the key existed ran: a fact about those
# runs, not a default (the default may change; what those runs did does not)
LATER_KEYS: dict[tuple[str, str], Any] = {
    ("bench", "ignore_eos"): True,       # requests ran to output_len, past EOS
    ("bench", "request_rate"): 0,        # each request went as soon as one in flight ended
    ("bench", "temperature"): 0,         # every request was greedy
    ("bench", "top_p"): 1,               # over the whole distribution
}


def canonical(doc: dict[str, Any]) -> dict[str, Any]:
    """The document as hashed and compared: each of ``LATER_KEYS`` dropped where it holds its earlier value."""
    out = dict(doc)
    for (section, key), value in LATER_KEYS.items():
        part = out.get(section)
        if isinstance(part, dict) and key in part and part[key] == value:
            out[section] = {k: v for k, v in part.items() if k != key}
    return out


def fingerprint(doc: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the document's canonical JSON."""
    text = json.dumps(canonical(doc), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(v: Any, key: str, out: dict[str, Any]) -> None:
    if isinstance(v, dict) and v:
        for k in sorted(v):
            _flat(v[k], f"{key}.{k}" if key else str(k), out)
    else:
        out[key] = v


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprint documents, one line each: ``bench.num_requests: 2 -> 6``."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flat(canonical(old), "", a)
    _flat(canonical(new), "", b)
    show = lambda v: "(absent)" if v is _ABSENT else json.dumps(v, default=str)   # noqa: E731
    return [f"{k}: {show(a.get(k, _ABSENT))} -> {show(b.get(k, _ABSENT))}"
            for k in sorted(set(a) | set(b)) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]


_ABSENT = object()


def pair_fingerprint(doc: dict[str, Any], arm: str, baseline: str) -> str:
    """The fingerprint of one compared pair: an arm and its baseline as resolved (server args, env), with the
    bench settings its runs ran under (the arm's bench condition, e.g. concurrency, over the experiment's) and timeouts, by content and not by name. The same pair under another arm name or in another
    experiment (a `--matrix steps=1,2,3` sweep and a later `--target-ci` run of its steps-3 arm alone) has the
    same pair fingerprint, so the node's history of the one is the other's prior."""
    arms = doc.get("arms") or {}
    a, bench = _with_bench(arms.get(arm), doc.get("bench"))
    b, _ = _with_bench(arms.get(baseline), doc.get("bench"))
    return fingerprint({"arm": a, "baseline": b, "bench": bench, "timeouts": doc.get("timeouts")})


def arm_fingerprint(doc: dict[str, Any], arm: str) -> str:
    """The fingerprint of one arm as resolved (server args, env), with the bench settings its runs ran under and the
    timeouts: the same arm in two experiments by content (stores pooled into one verdict,
    specab/analysis/evidence/combine.py)."""
    a, bench = _with_bench((doc.get("arms") or {}).get(arm), doc.get("bench"))
    return fingerprint({"arm": a, "bench": bench, "timeouts": doc.get("timeouts")})


def _with_bench(entry: Any, bench: Any) -> tuple[Any, Any]:
    """An arm's entry without its bench condition, and the bench its runs ran under (the experiment's with the arm's
    condition over it): a pair at concurrency 8 from a `--matrix concurrency=...` sweep and the same pair of an
    experiment whose bench.concurrency is 8 are one pair."""
    if not isinstance(entry, dict) or not entry.get("bench"):
        return entry, bench
    own = {k: v for k, v in entry.items() if k != "bench"}
    return own, {**(bench if isinstance(bench, dict) else {}), **entry["bench"]}


def pair_fingerprints(doc: dict[str, Any], baselines: dict[str, str]) -> dict[str, str]:
    """arm name -> pair fingerprint, for every arm of ``baselines`` (arm -> its baseline) that is not its own."""
    return {a: pair_fingerprint(doc, a, b) for a, b in baselines.items() if a != b}
