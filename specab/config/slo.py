"""The service-level objective: latency targets a request must meet, in the experiment (``slo:``) or on the command
line (``--slo ttft_ms:p95=200``), checked before any node is touched.

Terms (docs/architecture.md, "Experiment file"; the measurements: docs/analysis.md, "SLO and capacity"):

    ttft_ms   time to first token, ms, counted from the request's scheduled arrival under an arrival rate
    tpot_ms   time per output token after the first, ms
    itl_ms    inter-token latency per token, ms (a streamed chunk's gap spread over the tokens it carries)
    e2e_s     end-to-end latency, s, from the scheduled arrival under an arrival rate

each with one or more percentiles ``p50`` .. ``p99.9`` (any in (0, 100]) and a positive target:

    slo:
      ttft_ms: {p95: 200}
      tpot_ms: {p95: 10, p50: 6}
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

import yaml

from specab.config.yamlfile import ConfigError, key_line

# term -> (the request's latency it bounds, seconds per unit, its name in a sentence, its unit)
TERMS: dict[str, tuple[str, float, str, str]] = {
    "ttft_ms": ("ttft_s", 1e-3, "TTFT", "ms"),
    "tpot_ms": ("tpot_s", 1e-3, "TPOT", "ms"),
    "itl_ms": ("itl_token_s", 1e-3, "ITL per token", "ms"),
    "e2e_s": ("e2e_s", 1.0, "end-to-end", "s"),
}
_PCT = re.compile(r"^p(\d+(?:\.\d+)?)$")
_CLI = re.compile(r"^(?P<term>[^:=\s]+):(?P<pct>[^=\s]+)=(?P<target>\S+)$")


@dataclass(frozen=True)
class Term:
    """One target: the ``q``-th percentile of ``name`` within ``target`` (in the term's unit)."""
    name: str
    q: float
    target: float

    @property
    def metric(self) -> str:
        return TERMS[self.name][0]

    @property
    def target_s(self) -> float:
        return self.target * TERMS[self.name][1]

    @property
    def key(self) -> str:
        return f"{self.name}:p{self.q:g}"

    def text(self) -> str:
        """"p95 TTFT <= 200 ms"."""
        _, _, what, unit = TERMS[self.name]
        return f"p{self.q:g} {what} <= {self.target:g} {unit}"

    def to_dict(self) -> dict[str, Any]:
        return {"term": self.name, "percentile": self.q, "target": self.target, "text": self.text()}


@dataclass(frozen=True)
class Slo:
    terms: tuple[Term, ...]

    def text(self) -> str:
        return " and ".join(t.text() for t in self.terms)

    def to_dict(self) -> dict[str, Any]:
        return {"terms": [t.to_dict() for t in self.terms], "text": self.text()}


def _term_name(name: Any, at: str) -> str:
    if name not in TERMS:
        close = difflib.get_close_matches(str(name), list(TERMS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{at}: unknown SLO term {name!r}{hint}; the terms are {', '.join(TERMS)}.")
    return str(name)


def _percentile(text: Any, at: str) -> float:
    m = _PCT.match(str(text))
    q = float(m.group(1)) if m else None
    if q is None or not 0.0 < q <= 100.0:
        raise ConfigError(f"{at}: SLO percentile {text!r} must be p<q> with q in (0, 100], e.g. p50, p95, p99.9.")
    return q


def _target(value: Any, at: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and value != float("inf")
    if not ok:
        raise ConfigError(f"{at}: SLO target {value!r} must be a positive number (in the term's unit: ms for "
                          f"ttft_ms, tpot_ms and itl_ms, s for e2e_s).")
    return float(value)


def check_section(section: Any, where: str, root: yaml.Node | None, path: tuple[Any, ...]) -> tuple[Term, ...]:
    """The ``slo:`` mapping (term -> {pXX: target}) as terms, refused with the key and what to write when wrong."""
    if section is None:
        return ()
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"{where}{key_line(root, path)}: slo must be a mapping of terms to percentiles and "
                          f"targets, e.g. slo: {{ttft_ms: {{p95: 200}}, tpot_ms: {{p95: 10}}}}.")
    terms = []
    for name, pcts in section.items():
        at = f"{where}{key_line(root, path + (name,))}"
        term = _term_name(name, at)
        if not isinstance(pcts, dict) or not pcts:
            raise ConfigError(f"{at}: slo.{term} must map percentiles to targets, e.g. {term}: {{p95: 200}}.")
        for pct, target in pcts.items():
            at = f"{where}{key_line(root, path + (name, pct))}"
            terms.append(Term(term, _percentile(pct, at), _target(target, at)))
    return tuple(terms)


def parse_cli(values: list[str]) -> tuple[Term, ...]:
    """``--slo TERM:pQ=TARGET`` options as terms (ConfigError naming the option when wrong)."""
    terms = []
    for v in values:
        at = f"--slo {v}"
        m = _CLI.match(v.strip())
        if not m:
            raise ConfigError(f"{at}: write TERM:pQ=TARGET, e.g. --slo ttft_ms:p95=200 --slo tpot_ms:p95=10 "
                              f"(terms: {', '.join(TERMS)}).")
        try:
            target = float(m.group("target"))
        except ValueError:
            raise ConfigError(f"{at}: SLO target {m.group('target')!r} must be a positive number.") from None
        terms.append(Term(_term_name(m.group("term"), at), _percentile(m.group("pct"), at), _target(target, at)))
    return tuple(terms)


def resolve(section: tuple[Term, ...], cli: tuple[Term, ...]) -> Slo | None:
    """The experiment's terms with the command line's over them (one term and percentile: the command line's), in
    one order wherever the SLO is read (the terms' order above, then the percentile): a stored experiment's
    configuration keeps no order of its keys."""
    merged = {t.key: t for t in section}
    merged.update({t.key: t for t in cli})
    order = list(TERMS)
    return Slo(tuple(sorted(merged.values(), key=lambda t: (order.index(t.name), t.q)))) if merged else None


def from_config(config: Any, argv: list[str] | None = None) -> Slo | None:
    """The SLO of a stored experiment: its config's ``slo:`` and the ``--slo`` options of its command line (the
    analysis reads what the run was asked for; both were checked when it started)."""
    section = config.get("slo") if isinstance(config, dict) else None
    try:
        file_terms = check_section(section, "stored experiment", None, ("slo",))
        cli = parse_cli([argv[i + 1] for i, a in enumerate(argv or []) if a == "--slo" and i + 1 < len(argv or [])]
                        + [a.split("=", 1)[1] for a in argv or [] if a.startswith("--slo=")])
    except ConfigError:
        return None
    return resolve(file_terms, cli)
