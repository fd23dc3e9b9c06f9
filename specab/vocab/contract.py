"""The node contract: the names the node tools, the roles and the controller exchange, in one place.

stdlib only, no sibling imports: part of the shared vocabulary (``specab.vocab``), shipped to the node with the
node tools and imported by every layer of the controller alike (the run's phases and order are its ``phases``).
What lives here:

* the server-log lines of the engine's load phases (live progress, ready.json) and its fatal lines;
* run and experiment id rules;
* THE secret rule: which names are secrets, and how values, mappings, argv and free text are redacted;
  used by the node tools, the ansible-runner scrub, the store's config and the reports alike;
* how an nvidia-smi CSV cell reads: the node's queries, the results store and the analysis alike.
"""
from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------

REDACTED = "<redacted>"
SECRET_SUFFIXES = ("_TOKEN", "_KEY", "_SECRET")
SECRET_NAMES = frozenset({"HF_TOKEN", "TOKEN", "API_KEY", "KEY", "SECRET", "PASSWORD"})


def is_secret_name(name: str) -> bool:
    """Names whose values are never printed or stored: ``TOKEN``, ``*_TOKEN``, ``*_KEY``, ``*_SECRET``,
    ``*PASSWORD*``. Case-insensitive, and ``-`` counts as ``_`` so flags (``--api-key``) match too."""
    n = str(name).strip().lstrip("-").upper().replace("-", "_")
    return n in SECRET_NAMES or n.endswith(SECRET_SUFFIXES) or "PASSWORD" in n


def redact_value(name: str, value: Any) -> Any:
    return REDACTED if is_secret_name(name) and value not in (None, "") else value


def redact_env(env: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of a flat mapping (env, server args) with secret values replaced by ``<redacted>``."""
    return {k: redact_value(k, v) for k, v in env.items()}


def redact_mapping(mapping: Any) -> Any:
    """Deep copy of a JSON-like value with the values of secret-named keys replaced."""
    if isinstance(mapping, dict):
        return {k: REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "", False)
                else redact_mapping(v) for k, v in mapping.items()}
    if isinstance(mapping, list):
        return [redact_mapping(v) for v in mapping]
    return mapping


# A value runs to the next blank; the punctuation that closes it there (", " between the fields of a repr such as
# SGLang's ServerArgs(...) line, a closing bracket or quote) is not part of it and stays in the text.
_TAIL = r"(?P<tail>[,;)\]}\"']*)"
ASSIGN_RE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>'[^']*'|\"[^\"]*\"|\S+?)" + _TAIL + r"(?=\s|$)")
FLAG_RE = re.compile(r"(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>=|\s+)(?P<value>'[^']*'|\"[^\"]*\"|[^\s\\]+?)"
                     + _TAIL + r"(?=[\s\\]|$)")


def redact_text(text: str) -> str:
    """Redact ``SECRET_NAME=value`` assignments and ``--secret-flag value`` pairs in free text."""

    def assign(m: "re.Match[str]") -> str:
        return m.group("name") + "=" + REDACTED + m.group("tail") if is_secret_name(m.group("name")) else m.group(0)

    def flag(m: "re.Match[str]") -> str:
        if is_secret_name(m.group("flag")):
            return m.group("flag") + m.group("sep") + REDACTED + m.group("tail")
        return m.group(0)

    return FLAG_RE.sub(flag, ASSIGN_RE.sub(assign, text))


NOT_SECRET_WORDS = frozenset({"None", "null", "true", "false", "True", "False"})


def learnable(values: List[str]) -> List[str]:
    """Of the values found under a secret name, those worth scrubbing everywhere: no redaction placeholder, no
    logged default (api_key=None), no bare number (a tokenizer's eos_token id: scrubbing it would corrupt every
    number that holds its digits, and a secret is not a bare number)."""
    return [v for v in values if REDACTED not in v and v not in NOT_SECRET_WORDS and not v.strip().isdigit()]


def named_secret_values(text: str) -> List[str]:
    """The values a run file itself names as secret: the secret-named keys of a JSON document (a queue entry,
    args.json) and the secret-named assignments and flags of a text (launch.sh, nccl.env)."""
    words = [m.group("value") for m in ASSIGN_RE.finditer(text) if is_secret_name(m.group("name"))]
    words += [m.group("value") for m in FLAG_RE.finditer(text) if is_secret_name(m.group("flag"))]
    out = nested_secret_values(text) if text.lstrip()[:1] in ("{", "[") else []
    for w in words:
        if len(w) >= 2 and w[0] == w[-1] and w[0] in "'\"":
            w = w[1:-1]                         # a quoted value is scrubbed without its quotes
        else:                                   # an unquoted one ends where a JSON string or a list would go on
            w = re.split(r"[\"'\\,;)\]}]", w, maxsplit=1)[0]
        out.append(w)
    return learnable(out)


def secret_values(*mappings: Dict[str, Any]) -> List[str]:
    """The values of secret-named keys (to scrub from files that may hold them verbatim)."""
    out: List[str] = []
    for m in mappings:
        out += [str(v) for k, v in m.items() if is_secret_name(k) and v not in (None, "", False, True)]
    return out


def nested_secret_values(value: Any) -> List[str]:
    """The values of secret-named keys anywhere in a JSON-like value, also inside strings that hold JSON (a
    command's stdout, a file's content in a task result): what an Ansible task result may carry."""
    out: List[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, (str, int, float)) \
                    and not isinstance(v, bool) and v not in ("", REDACTED):
                out.append(str(v))
            else:
                out += nested_secret_values(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += nested_secret_values(v)
    elif isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            out += nested_secret_values(json.loads(value))
    return out


# The files of a node run directory that hold a secret by design (the engine's argv, its env, the args it was
# given) or may (the engine's log, the run queue's entry with the node env), and their mode wherever a copy is
# written: their owner's alone.
PRIVATE_RUN_FILES = {"launch.sh": 0o700, "nccl.env": 0o600, "args.json": 0o600, "server.log": 0o600,
                     "queue_entry.json": 0o600}


# The node's record of a run's helper processes in its run directory (the bench step's client and GPU sampler, the
# bench tool itself, a non-head rank's GPU sampler: specab.node.ownership.record_helpers), for a stop to end them when
# their owner was cut off; removed once they are gone, so never one of the run's records (the driver fetches no copy).
HELPERS_JSON = "helpers.json"


# A value shorter than this is not scrubbed from free text: it would also replace ordinary words and numbers.
MIN_SCRUB_LEN = 4


def scrub_values(values: Iterable[Any]) -> List[str]:
    """The distinct values worth scrubbing, longest first (so a value that contains another goes whole)."""
    return sorted({str(v) for v in values if v is not None and len(str(v)) >= MIN_SCRUB_LEN}, key=len, reverse=True)


def scrub_bytes(data: bytes, values: Sequence[str]) -> bytes:
    """``data`` with every value of ``scrub_values(...)`` replaced by ``<redacted>``, as written verbatim and as
    escaped inside a JSON string."""
    for v in values:
        for enc in {v.encode(), json.dumps(v)[1:-1].encode()}:
            data = data.replace(enc, REDACTED.encode())
    return data


def scrub_text(text: str, values: Sequence[str]) -> str:
    """``scrub_bytes`` for text, then ``redact_text``: known values, and secret assignments and flags whose value
    was never known (an environment read on the node)."""
    for v in values:
        for enc in {v, json.dumps(v)[1:-1]}:
            text = text.replace(enc, REDACTED)
    return redact_text(text)


# ---------------------------------------------------------------------------------------------
# Engine log lines: load phases and fatal lines
# ---------------------------------------------------------------------------------------------

READY_LINE = "The server is fired up and ready to roll!"


class LoadLine(NamedTuple):
    key: str                  # ready.json's phases key
    needle: str               # substring of the server-log line
    which: str                # "first" or "last" occurrence is recorded (TP ranks each print one)
    display: Optional[str]    # the live progress's load sub-phase it announces (None: not shown)


LOAD_LINES: Tuple[LoadLine, ...] = (
    LoadLine("load_weight_begin", "Load weight begin", "first", "loading weights"),
    LoadLine("load_weight_end", "Load weight end", "last", "loading weights done"),
    LoadLine("capture_cuda_graph_begin", "Capture cuda graph begin", "first", "capturing graphs"),
    LoadLine("capture_cuda_graph_end", "Capture cuda graph end", "last", "graphs captured"),
    LoadLine("capture_draft_cuda_graph_begin", "Capture draft cuda graph begin", "first", "capturing graphs"),
    LoadLine("capture_draft_cuda_graph_end", "Capture draft cuda graph end", "last", None),
    # SGLang 0.5.15+ (0.5.23) rewords the capture lines (the 2026 engines reference A3); same keys,
    # so ready.json and the live progress read both generations
    LoadLine("capture_cuda_graph_begin", "Capture target decode CUDA graph begin", "first", "capturing graphs"),
    LoadLine("capture_cuda_graph_begin", "Capture target verify CUDA graph begin", "first", "capturing graphs"),
    LoadLine("capture_cuda_graph_end", "Capture target decode CUDA graph end", "last", "graphs captured"),
    LoadLine("capture_cuda_graph_end", "Capture target verify CUDA graph end", "last", "graphs captured"),
    LoadLine("capture_draft_cuda_graph_begin", "Capture draft decode CUDA graph begin", "first", "capturing graphs"),
    LoadLine("capture_draft_cuda_graph_end", "Capture draft decode CUDA graph end", "last", None),
    LoadLine("ready_line", READY_LINE, "first", "ready"),
)

# ready.json's load keys -> the display sub-phases of `loading` that the driver stores
LOAD_SUBPHASES: Tuple[Tuple[str, str], ...] = (("load_weight_begin", "loading weights"),
                                               ("capture_cuda_graph_begin", "capturing graphs"))


def load_phase(line: str) -> Optional[str]:
    """The load sub-phase a server-log line announces, if any."""
    return next((ll.display for ll in LOAD_LINES if ll.needle in line and ll.display is not None), None)


# Lines after which the server will not become ready: readiness fails fast on them (named for the message).
FATAL_LINES: Tuple[Tuple[str, "re.Pattern[str]"], ...] = (
    ("out of memory", re.compile(r"out of memory|OutOfMemoryError|Not enough memory", re.I)),
    ("unrecognized arguments", re.compile(r"error: unrecognized arguments")),
    ("invalid argument", re.compile(r"^\S*: error: argument ")),
    # SGLang 0.5.23 with a 0.5.9 flag: "error: ambiguous option: --cuda-graph-max-bs could match ..." (exit 2)
    ("ambiguous option", re.compile(r"error: ambiguous option: ")),
    ("address in use", re.compile(r"Address already in use|address already in use")),
    ("child failed", re.compile(r"Received sigquit from a child process|Scheduler hit an exception")),
)
TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\)")
# Where an error excerpt starts: a traceback, a fatal line, or any line that reads like an error (wider than
# FATAL_LINES, which must not fire on a line that a healthy server also prints).
FIRST_ERROR_RE = re.compile("|".join([TRACEBACK_RE.pattern] + [p.pattern for _, p in FATAL_LINES]
                                     + [r"Error:", r"Killed", r"Segmentation fault"]), re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Ids
# ---------------------------------------------------------------------------------------------

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")                 # experiment and run ids
QUEUE_ENTRY_RE = re.compile(r"^(?P<seq>\d{6})-(?P<run_id>[A-Za-z0-9][A-Za-z0-9._-]{0,95})\.json$")


def run_id(seq: int, arm: str) -> str:
    """A run's id: its plan sequence number and its arm (``003-eagle3-s2``)."""
    return "%03d-%s" % (seq, arm)


# ---------------------------------------------------------------------------------------------
# The benchmark client's processes
# ---------------------------------------------------------------------------------------------

# bench.client_procs: CLIENT_PROCS_AUTO, or the number of client processes the concurrency slots are divided among.
# auto is one process per CLIENT_SLOTS_PER_PROC slots (one up to 8 in flight, as the client always ran), at most one
# per CPU: one Python process (one GIL) parsing an SSE chunk per token used 82 % of a core at 16 in flight and 99 %
# at 32 on an H200 (SGLang, ~12,000 tokens/s streamed), where it may set the per-user rate it measures.
CLIENT_PROCS_AUTO = "auto"
CLIENT_SLOTS_PER_PROC = 8


def client_procs(value: Any, name: str = "bench.client_procs") -> Any:
    """bench.client_procs as the controller checks it and the client takes it: CLIENT_PROCS_AUTO or an integer >= 1
    (a whole number written as text too). ValueError, naming ``name``, for anything else."""
    if isinstance(value, str) and value.strip().lower() == CLIENT_PROCS_AUTO:
        return CLIENT_PROCS_AUTO
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError("%s must be auto (one client process per %d requests in flight, at most one per CPU of the "
                     "node) or a whole number of processes >= 1, got %r" % (name, CLIENT_SLOTS_PER_PROC, value))


# ---------------------------------------------------------------------------------------------
# nvidia-smi's CSV cells
# ---------------------------------------------------------------------------------------------

_SMI_NOT_A_VALUE = re.compile(r"^\[.*\]$")                      # [N/A], [Not Supported], ...
_SMI_UNIT_SUFFIX = re.compile(r"^(-?[0-9.]+)\s*(MiB|MHz|W|%|C)$")


def smi_value(raw: str) -> Any:
    """One CSV cell: ``[N/A]``-like tokens → None, numbers → int/float, units stripped; other text as it is."""
    v = raw.strip()
    if v == "" or _SMI_NOT_A_VALUE.match(v) or v in ("N/A", "Not Supported"):
        return None
    m = _SMI_UNIT_SUFFIX.match(v)
    if m:
        v = m.group(1)
    if re.match(r"^-?\d+$", v):
        return int(v)
    if re.match(r"^-?\d+\.\d*$", v):
        return float(v)
    return v


def smi_number(raw: Any) -> Optional[float]:
    """A cell (or a value read back from JSON) as a number: None where it is empty, N/A-like or no number."""
    if raw is None:
        return None
    v = smi_value(str(raw))
    try:
        return None if v is None else float(v)
    except ValueError:
        return None
