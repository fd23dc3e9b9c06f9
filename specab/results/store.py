"""The results store: one SQLite file per experiment, `runs/<experiment-id>/results.sqlite`.

Written as results arrive (one transaction per finished run), so an interrupted experiment keeps
every finished run and can be resumed. The schema is documented in docs/results.md; readers
(stats, doctor, report, export) use the read methods below or plain SQL.
"""
from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from specab.results import connect
from specab.vocab import contract, engines

SCHEMA_VERSION = 2
# Versions this specab reads and resumes. 1 had runs.timings_json (a node timings.json that nothing wrote any
# more); 2 dropped it. A version-1 store keeps the column, which the reads ignore and the writes leave NULL.
READABLE_SCHEMA_VERSIONS = (1, 2)
FILENAME = "results.sqlite"

# Run status values.
RUNNING, OK, FAILED, INTERRUPTED = "running", "ok", "failed", "interrupted"
DONE_STATUSES = (OK, FAILED)

# Experiment fingerprints (additive, schema version unchanged: a store without these tables is read
# as one without fingerprints, and they are created when a session of this specab writes to it).
FINGERPRINT_SCHEMA = """
CREATE TABLE IF NOT EXISTS fingerprints (
    fingerprint TEXT PRIMARY KEY,           -- specab.config.fingerprint: 16 hex digits
    doc_json    TEXT NOT NULL,              -- what was hashed (model, server args, env, arms, bench, timeouts)
    recorded    REAL NOT NULL,              -- first session that ran under it
    forced      INTEGER NOT NULL DEFAULT 0  -- 1: a resume under --force-changed
);
CREATE TABLE IF NOT EXISTS run_fingerprints (
    seq         INTEGER PRIMARY KEY,        -- the run (latest attempt) ...
    fingerprint TEXT NOT NULL               -- ... ran under this fingerprint
);
"""

# The design's decisions after each block (additive like the fingerprints).
DESIGN_SCHEMA = """
CREATE TABLE IF NOT EXISTS design_steps (
    blocks    INTEGER PRIMARY KEY,          -- blocks started when decided (the latest decision for that count)
    decided   REAL NOT NULL,
    design    TEXT NOT NULL,                -- cost | sequential
    more      INTEGER NOT NULL,             -- 1: one more block was planned
    requests  INTEGER,                      -- measured requests per run of that block
    reason    TEXT NOT NULL,                -- the decision in words (shown live and in the report)
    plan_json TEXT                          -- the design then: blocks, requests, expected GPU-seconds, components
);
"""

SCHEMA = FINGERPRINT_SCHEMA + DESIGN_SCHEMA + """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS experiment (
    id              TEXT PRIMARY KEY,   -- <name>-<YYYYmmdd-HHMMSS>
    name            TEXT NOT NULL,
    created         REAL NOT NULL,      -- unix seconds
    finished        REAL,
    status          TEXT NOT NULL,      -- running | finished | interrupted | stopped (a systematic failure)
    seed            INTEGER NOT NULL,
    repeats         INTEGER NOT NULL,   -- blocks planned (grows when blocks are added)
    order_mode      TEXT NOT NULL,      -- interleaved | blocked
    experiment_file TEXT,
    inventory_file  TEXT,
    config_json     TEXT NOT NULL,      -- the specab_experiment mapping (secrets redacted)
    matrix_json     TEXT NOT NULL,      -- the --matrix options as given (list of strings)
    argv_json       TEXT NOT NULL,
    hosts_json      TEXT NOT NULL,      -- inventory hosts of gpu_nodes
    specab_version  TEXT,
    git_sha         TEXT,
    options_json    TEXT                -- the driver's options as one record (what a resume continues)
);
CREATE TABLE IF NOT EXISTS arms (
    name                 TEXT PRIMARY KEY,
    position             INTEGER NOT NULL,  -- order of definition
    is_baseline          INTEGER NOT NULL,  -- 1 for a non-speculative arm
    baseline             TEXT NOT NULL,     -- the baseline arm this arm is compared with (itself for a baseline)
    server_args_json     TEXT NOT NULL,     -- resolved server args (SGLang field names), model_path included (secrets redacted)
    env_json             TEXT NOT NULL,     -- resolved env (secrets redacted)
    matrix_json          TEXT NOT NULL,     -- matrix values that made this arm ({} for file arms)
    speculative_algorithm TEXT,
    spec_steps           INTEGER,
    spec_topk            INTEGER,
    spec_draft_tokens    INTEGER
);
CREATE TABLE IF NOT EXISTS plan (
    seq      INTEGER PRIMARY KEY,           -- 1-based execution order
    run_id   TEXT NOT NULL UNIQUE,          -- <seq:03d>-<arm>
    block    INTEGER NOT NULL,              -- replicate block (1-based)
    position INTEGER NOT NULL,              -- position within the block
    arm      TEXT NOT NULL REFERENCES arms(name),
    num_requests INTEGER,                   -- measured requests the design by cost chose for the run's block;
                                            -- NULL: the experiment's bench.num_requests when the run runs (a
                                            -- --force-changed resume runs it with the changed experiment's)
    burn_in  INTEGER NOT NULL DEFAULT 0,    -- 1: an unmeasured start before its block (design.burn_in), not analysed
    instance INTEGER,                       -- one server per instance: the seq of its instance's first run;
                                            -- NULL: the run starts a server of its own
    instance_pos INTEGER                    -- its position in that instance (1-based); NULL without one
);
CREATE TABLE IF NOT EXISTS runs (
    seq            INTEGER PRIMARY KEY REFERENCES plan(seq),
    run_id         TEXT NOT NULL,
    arm            TEXT NOT NULL,
    block          INTEGER NOT NULL,
    host           TEXT,                    -- inventory host(s), comma-separated
    attempt        INTEGER NOT NULL DEFAULT 1,
    status         TEXT NOT NULL,           -- running | ok | failed | interrupted
    started        REAL NOT NULL,
    finished       REAL,
    duration_s     REAL,
    failure_phase  TEXT,                    -- stopping | waiting for GPUs | starting | loading ... | collecting
    failure_reason TEXT,
    log_tail       TEXT,                    -- last lines of server.log (or of the Ansible output)
    partial        INTEGER NOT NULL DEFAULT 0,  -- 1 when bench.jsonl holds fewer records than planned
    n_requests     INTEGER,                 -- measured (non-warm-up) request records stored
    n_ok           INTEGER,
    decode_tok_s_median REAL,               -- from bench_summary.json, for quick looks
    accept_len_mean     REAL,
    run_dir        TEXT,                    -- absolute controller path runs/<experiment-id>/<run_id>
    runner_ident   TEXT,
    runner_status  TEXT,                    -- ansible-runner status: successful | failed | canceled | timeout
    runner_rc      INTEGER,
    summary_json     TEXT,                  -- bench_summary.json
    load_phases_json TEXT,                  -- server load phases (weights loaded, graphs captured, ready)
    server_info_json TEXT,                  -- /get_server_info as collected
    stop_json        TEXT,                  -- stop.json (signals, escalation, durations)
    gpu_free_json    TEXT,                  -- gpu_free.json (time-to-free)
    gpus           INTEGER,                 -- GPUs the run's server held (tp_size x pp_size)
    gpu_seconds    REAL,                    -- duration_s x gpus: what the run cost (docs/statistics.md)
    server_seq     INTEGER                  -- the run whose server start this run measured on (itself, or the run
                                            -- that started its instance's server: docs/decisions/0011)
);
CREATE TABLE IF NOT EXISTS run_phases (
    seq        INTEGER NOT NULL REFERENCES runs(seq),
    phase      TEXT NOT NULL,               -- stopping | waiting for GPUs | starting | loading weights | capturing graphs | ready | verifying env | benchmarking | collecting
    started    REAL NOT NULL,
    finished   REAL,
    duration_s REAL,
    PRIMARY KEY (seq, phase)
);
CREATE TABLE IF NOT EXISTS requests (
    seq            INTEGER NOT NULL REFERENCES runs(seq),
    host           TEXT NOT NULL,
    line           INTEGER NOT NULL,        -- line number in bench.jsonl (0-based)
    i              INTEGER,
    warmup         INTEGER NOT NULL,
    ok             INTEGER NOT NULL,
    error          TEXT,
    start_ts       REAL,
    prompt_tokens  INTEGER,
    output_tokens  INTEGER,
    ttft_s         REAL,
    e2e_s          REAL,
    decode_tok_s   REAL,
    tpot_s         REAL,
    spec_verify_ct INTEGER,
    accept_len     REAL,
    chunk_t_json      TEXT,                 -- per streamed chunk: time since send (s)
    chunk_tokens_json TEXT,                 -- per streamed chunk: tokens carried
    extra_json     TEXT,                    -- any other fields of the record
    PRIMARY KEY (seq, host, line)
);
CREATE TABLE IF NOT EXISTS gpu_samples (
    seq          INTEGER NOT NULL REFERENCES runs(seq),
    host         TEXT NOT NULL,
    ts           REAL,                      -- unix seconds
    gpu          INTEGER,
    sm_clock_mhz REAL,
    mem_clock_mhz REAL,
    max_sm_clock_mhz REAL,
    power_w      REAL,
    temp_c       REAL,
    util_pct     REAL,
    mem_used_mib REAL,
    throttle_reasons TEXT,
    raw_json     TEXT NOT NULL,             -- the CSV row as a {column: value} object
    uuid         TEXT                       -- the row's `uuid` (added 2026-11; NULL: read raw_json)
);
CREATE TABLE IF NOT EXISTS manifests (
    seq           INTEGER NOT NULL REFERENCES runs(seq),
    host          TEXT NOT NULL,
    manifest_json TEXT NOT NULL,
    PRIMARY KEY (seq, host)
);
CREATE TABLE IF NOT EXISTS env_checks (
    seq        INTEGER NOT NULL REFERENCES runs(seq),
    host       TEXT NOT NULL,
    ok         INTEGER,
    check_json TEXT NOT NULL,
    PRIMARY KEY (seq, host)
);
CREATE TABLE IF NOT EXISTS run_files (
    seq     INTEGER NOT NULL REFERENCES runs(seq),
    host    TEXT NOT NULL,
    name    TEXT NOT NULL,                  -- file name in the run directory (small text files only)
    content TEXT NOT NULL,
    PRIMARY KEY (seq, host, name)
);
CREATE INDEX IF NOT EXISTS requests_seq ON requests(seq);
CREATE INDEX IF NOT EXISTS gpu_samples_seq ON gpu_samples(seq);
"""

# What a store written by an older specab lacks, added by its first write transaction (`migrate`): each addition is
# additive, the schema version unchanged, and a store only read (on read-only media too) is read as it is, the reads
# knowing each absence. The tables are FINGERPRINT_SCHEMA's and DESIGN_SCHEMA's.
ADDED_COLUMNS = (("gpu_samples", "uuid", "TEXT"),                     # 2026-11
                 ("plan", "num_requests", "INTEGER"),                 # 2026-12: the design by cost's requests
                 ("runs", "gpus", "INTEGER"), ("runs", "gpu_seconds", "REAL"),  # 2026-12: the verdict cost
                 ("plan", "burn_in", "INTEGER NOT NULL DEFAULT 0"),   # design.burn_in
                 ("experiment", "options_json", "TEXT"),              # the options' record
                 ("plan", "instance", "INTEGER"), ("plan", "instance_pos", "INTEGER"),   # one server per instance
                 ("runs", "server_seq", "INTEGER"))                   # ... and the start each run measured on


def migrate(c: sqlite3.Connection) -> None:
    """Bring the store of connection `c` up to this specab's tables and columns, inside a write transaction (so two
    connections of one store, a fleet's host threads, add each once)."""
    for table in (FINGERPRINT_SCHEMA + DESIGN_SCHEMA).split(";"):
        if table.strip():
            c.execute(table)
    have: dict[str, set[str]] = {}
    for table, col, kind in ADDED_COLUMNS:
        if col not in have.setdefault(table, {r[1] for r in c.execute(f"PRAGMA table_info({table})")}):
            c.execute(f"ALTER TABLE {table} ADD COLUMN {col} {kind}")


REQUEST_FIELDS = ("i", "warmup", "ok", "error", "start_ts", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s",
                  "decode_tok_s", "tpot_s", "spec_verify_ct", "accept_len")
GPU_COLUMNS = {  # a GPU samples CSV's header cell (an nvidia-smi query name, any case, units dropped) -> store column
    "timestamp": "ts", "ts": "ts", "time": "ts", "t": "ts", "index": "gpu", "gpu": "gpu", "gpu_index": "gpu",
    "uuid": "uuid", "gpu_uuid": "uuid",
    "clocks.sm": "sm_clock_mhz", "clocks.current.sm": "sm_clock_mhz", "sm_mhz": "sm_clock_mhz",
    "clocks_sm": "sm_clock_mhz", "clocks.mem": "mem_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz", "clocks.max.sm_mhz": "max_sm_clock_mhz", "max_sm_mhz": "max_sm_clock_mhz",
    "clocks_max_sm": "max_sm_clock_mhz", "power.draw": "power_w", "temperature.gpu": "temp_c",
    "utilization.gpu": "util_pct", "util": "util_pct", "util_pct": "util_pct", "memory.used": "mem_used_mib",
    "clocks_event_reasons.active": "throttle_reasons", "clocks_throttle_reasons.active": "throttle_reasons",
    "reasons": "throttle_reasons", "throttle_reasons": "throttle_reasons",
}
GPU_TEXT_COLUMNS = ("uuid", "throttle_reasons")     # kept as text; the other columns are numbers


def gpu_csv_columns(header: Iterable[str]) -> list[str | None]:
    """The store column each header cell of a GPU samples CSV names (None: a column not kept)."""
    return [GPU_COLUMNS.get(re.sub(r"\s*\[.*\]$", "", h.strip()).lower()) for h in header]


class GpuCsv(NamedTuple):
    header: list[str]
    columns: list[str | None]                            # the store column of each header cell (None: not kept)
    rows: list[tuple[dict[str, Any], dict[str, str]]]    # (values by store column, cells by header)


def gpu_csv_rows(text: str) -> GpuCsv:
    """A GPU samples CSV, read the one way the store and the analysis both use. A row's values by store column:
    numbers read as nvidia-smi writes them, GPU_TEXT_COLUMNS as text, of a column named twice the first; its cells
    by header as written. A blank row, and a row shorter than the header (the line a stopped sampler was writing),
    are no sample."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return GpuCsv([], [], [])
    header = [h.strip() for h in rows[0]]
    columns = gpu_csv_columns(header)
    out: list[tuple[dict[str, Any], dict[str, str]]] = []
    for row in rows[1:]:
        if len(row) < len(header) or not any(cell.strip() for cell in row):
            continue
        values: dict[str, Any] = {}
        for key, cell in zip(columns, row):
            if key and key not in values:
                values[key] = cell.strip() if key in GPU_TEXT_COLUMNS else contract.smi_number(cell)
        out.append((values, {h: cell.strip() for h, cell in zip(header, row)}))
    return GpuCsv(header, columns, out)


# (the errors live with the connections; their names are the store's: st.StoreError, st.StoreBusy)
StoreError, StoreBusy, StoreReadOnly = connect.StoreError, connect.StoreBusy, connect.StoreReadOnly


def _dumps(v: Any) -> str | None:
    return None if v is None else json.dumps(v, sort_keys=True)


def _decoded(rows: list[dict[str, Any]], *columns: str) -> list[dict[str, Any]]:
    """`rows` with each `<name>_json` column of `columns` replaced by `<name>`, decoded (NULL: None)."""
    for r in rows:
        for k in columns:
            v = r.pop(k)
            r[k[:-5]] = json.loads(v) if v else None
    return rows


def store_file(path: str | Path) -> Path:
    """The results store of `path`, an experiment directory or its store file; StoreError where there is none."""
    p = Path(path)
    if p.is_dir():
        p = p / FILENAME
    if not p.exists():
        raise StoreError(f"{p}: no results store here. Give an experiment directory runs/<experiment-id>/ "
                         f"or its {FILENAME}.")
    return p


class StoreReads:
    """What the analysis and the driver read back from a store: any store this specab reads, one written by an older
    specab too (an absent table or column reads as empty), on read-only media too (nothing here writes)."""

    conn: sqlite3.Connection
    _gpu_uuid_column: bool | None

    def _has_gpu_uuid_column(self) -> bool:
        if self._gpu_uuid_column is None:
            cols = {r[1] for r in self.conn.execute("PRAGMA table_info(gpu_samples)")}
            self._gpu_uuid_column = "uuid" in cols
        return self._gpu_uuid_column

    def design_steps(self) -> list[dict[str, Any]]:
        """The design's decisions in block order ([] for a store without any: no --target-ci, or older)."""
        if not self._has_table("design_steps"):
            return []
        out = _decoded(self._rows("SELECT * FROM design_steps ORDER BY blocks"), "plan_json")
        for r in out:
            r["more"] = bool(r["more"])
        return out

    def _has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                                 (name,)).fetchone() is not None

    def fingerprint(self) -> tuple[str, dict[str, Any]] | None:
        """(the experiment's fingerprint, its document); None for a store written before fingerprints."""
        row = self.conn.execute("SELECT value FROM meta WHERE key='fingerprint'").fetchone()
        if row is None or not self._has_table("fingerprints"):
            return None
        doc = self.conn.execute("SELECT doc_json FROM fingerprints WHERE fingerprint=?", (row[0],)).fetchone()
        return row[0], (json.loads(doc[0]) if doc else {})

    def run_fingerprints(self) -> dict[int, str]:
        """seq -> the fingerprint each run ran under (empty for a store written before fingerprints)."""
        if not self._has_table("run_fingerprints"):
            return {}
        return {r[0]: r[1] for r in self.conn.execute("SELECT seq, fingerprint FROM run_fingerprints")}

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute(sql, args).fetchall()]

    def experiment(self) -> dict[str, Any]:
        rows = self._rows("SELECT * FROM experiment")
        if not rows:
            raise StoreError(f"{self.path}: no experiment recorded.")
        e = _decoded(rows, "config_json", "matrix_json", "argv_json", "hosts_json")[0]
        e["options"] = json.loads(e.pop("options_json", None) or "null")     # None: a store before the record
        return e

    def arms(self) -> list[dict[str, Any]]:
        out = _decoded(self._rows("SELECT * FROM arms ORDER BY position"), "server_args_json", "env_json",
                       "matrix_json")
        for a in out:
            a["is_baseline"] = bool(a["is_baseline"])
        return out

    def plan(self) -> list[dict[str, Any]]:
        out = self._rows("SELECT * FROM plan ORDER BY seq")
        for r in out:
            r["burn_in"] = bool(r.get("burn_in"))       # absent (False) in a store written before design.burn_in
        return out

    def burn_in_seqs(self) -> set[int]:
        """The seqs of the plan's burn-in runs (design.burn_in): run and stored like any, never analysed."""
        if "burn_in" not in {r[1] for r in self.conn.execute("PRAGMA table_info(plan)")}:
            return set()
        return {r[0] for r in self.conn.execute("SELECT seq FROM plan WHERE burn_in != 0")}

    def runs(self, status: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM runs" + (" WHERE status=?" if status else "") + " ORDER BY seq"
        out = _decoded(self._rows(sql, (status,) if status else ()), "summary_json", "load_phases_json",
                       "server_info_json", "stop_json", "gpu_free_json")
        burn_in = self.burn_in_seqs()
        for r in out:
            r["burn_in"] = r["seq"] in burn_in
            r.pop("timings_json", None)     # a version-1 store's column, no longer read
            r["partial"] = bool(r["partial"])
        return out

    def not_ok(self) -> list[dict[str, Any]]:
        """Planned runs without an ok record (missing, failed or interrupted), in planned order."""
        return self._rows("SELECT p.* FROM plan p LEFT JOIN runs r ON r.seq = p.seq"
                          " WHERE r.status IS NULL OR r.status != ? ORDER BY p.seq", (OK,))

    def missing(self) -> list[dict[str, Any]]:
        """Planned runs without a finished (ok or failed) record, in planned order."""
        return self._rows("SELECT p.* FROM plan p LEFT JOIN runs r ON r.seq = p.seq"
                          " WHERE r.status IS NULL OR r.status NOT IN (?, ?) ORDER BY p.seq", DONE_STATUSES)

    def phases(self, seq: int | None = None) -> list[dict[str, Any]]:
        if seq is None:
            return self._rows("SELECT * FROM run_phases ORDER BY seq, started")
        return self._rows("SELECT * FROM run_phases WHERE seq=? ORDER BY started", (seq,))

    def requests(self, seq: int | None = None, include_warmup: bool = False) -> list[dict[str, Any]]:
        where = []
        args: list[Any] = []
        if seq is not None:
            where.append("seq=?")
            args.append(seq)
        if not include_warmup:
            where.append("warmup=0")
        sql = "SELECT * FROM requests" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY seq, host, line"
        out = self._rows(sql, tuple(args))
        for r in out:
            r["warmup"], r["ok"] = bool(r["warmup"]), bool(r["ok"])
            r["chunk_t_s"] = json.loads(r.pop("chunk_t_json") or "null")
            r["chunk_tokens"] = json.loads(r.pop("chunk_tokens_json") or "null")
            r["extra"] = json.loads(r.pop("extra_json") or "null")
        return out

    def request_chunks(self, seq: int) -> list[tuple[int, list[float], list[int]]]:
        """A run's measured, answered requests as (i, chunk_t_s, chunk_tokens): the per-chunk arrays that
        request_rows leaves out (an empty list where a record had none)."""
        cur = self._tuples("SELECT i, chunk_t_json, chunk_tokens_json FROM requests WHERE seq=? AND warmup=0 AND ok=1"
                           " ORDER BY host, line", (seq,))
        return [(i, json.loads(t or "null") or [], json.loads(n or "null") or []) for i, t, n in cur]

    def request_outputs(self, seq: int) -> list[dict[str, Any]]:
        """A run's measured request records as the output checks read them: ``i``, ``ok``, ``warmup`` and, from
        extra_json, ``output_ids`` / ``output_text`` / ``finish_reason`` (no chunk arrays)."""
        cur = self._tuples("SELECT i, ok, extra_json FROM requests WHERE seq=? AND warmup=0 ORDER BY host, line",
                           (seq,))
        out = []
        for i, ok, extra in cur:
            rec = json.loads(extra or "null") or {}
            out.append({"i": i, "ok": bool(ok), "warmup": False, "output_ids": rec.get("output_ids"),
                        "output_text": rec.get("output_text"), "finish_reason": rec.get("finish_reason")})
        return out

    # Lean readers for the analysis of large experiments (docs/performance.md, benchmarks 5 and 6): tuples
    # of the columns it uses, streamed from the cursor. The chunk arrays, extra_json and the GPU samples'
    # raw_json are not decoded (a 1,000-run experiment has ~330,000 GPU-sample rows).
    # plus the keys of extra_json the analysis reads: a dataset request's category (loadgen copies it from the
    # record) and the engine's finish reason (stop: the model ended the answer; length: output_len was reached)
    # and, under an open load, the request's scheduled arrival and its wait for a free slot of the client, and
    # whether its tokens reached the client in a burst (node/loadgen)
    REQUEST_EXTRAS = ("category", "finish_reason", "arrival_s", "arrival_wait_s", "buffered")
    REQUEST_ROW = ("seq",) + REQUEST_FIELDS + REQUEST_EXTRAS

    GPU_SAMPLE_ROW = ("seq", "ts", "gpu", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "util_pct",
                      "power_w", "temp_c", "throttle_reasons", "host", "uuid")

    def _tuples(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        cur = self.conn.cursor()
        cur.row_factory = None          # plain tuples: a quarter of sqlite3.Row's cost per row
        return cur.execute(sql, args)

    def request_rows(self) -> Iterator[tuple[Any, ...]]:
        """Request records as tuples in REQUEST_ROW order (warmup and ok as 0/1), ordered like requests(); the
        REQUEST_EXTRAS read from extra_json (None where a record had no such key)."""
        cols = ", ".join(("seq",) + REQUEST_FIELDS)
        tail = " FROM requests ORDER BY seq, host, line"
        extras = ", ".join(f"json_extract(extra_json, '$.{k}')" for k in self.REQUEST_EXTRAS)
        try:
            cur = self._tuples(f"SELECT {cols}, {extras}{tail}")
        except sqlite3.OperationalError as exc:       # an SQLite built without JSON1: decode here
            if "json_extract" not in str(exc):
                raise
            for row in self._tuples(f"SELECT {cols}, extra_json{tail}"):
                extra = json.loads(row[-1]) if row[-1] else {}
                yield row[:-1] + tuple(extra.get(k) for k in self.REQUEST_EXTRAS)
            return
        yield from cur

    def gpu_sample_rows(self) -> Iterator[tuple[Any, ...]]:
        """GPU samples with a timestamp as tuples in GPU_SAMPLE_ROW order, by seq and then as inserted (the CSV's
        order, which is by time: sort a run's rows by ts where it is not). uuid is the CSV row's `uuid` column
        (None when the CSV had none): the uuid column, or raw_json's for rows written before it existed."""
        cols = ", ".join(self.GPU_SAMPLE_ROW[:-1])
        order = " FROM gpu_samples WHERE ts IS NOT NULL ORDER BY seq, rowid"     # the seq index's order: no sort
        from_raw = "json_extract(raw_json, '$.uuid')"
        uuid = f"COALESCE(uuid, {from_raw})" if self._has_gpu_uuid_column() else from_raw
        try:
            cur = self._tuples(f"SELECT {cols}, {uuid}{order}")
        except sqlite3.OperationalError as exc:       # an SQLite built without JSON1: decode here
            if "json_extract" not in str(exc):
                raise
            uuid = "uuid, raw_json" if self._has_gpu_uuid_column() else "NULL, raw_json"
            for row in self._tuples(f"SELECT {cols}, {uuid}{order}"):
                yield row[:-2] + (row[-2] if row[-2] is not None else
                                  json.loads(row[-1]).get("uuid") if row[-1] else None,)
            return
        yield from cur

    def gpu_samples(self, seq: int | None = None) -> list[dict[str, Any]]:
        if seq is None:
            return self._rows("SELECT * FROM gpu_samples ORDER BY seq, ts")
        return self._rows("SELECT * FROM gpu_samples WHERE seq=? ORDER BY ts", (seq,))

    def manifests(self) -> list[dict[str, Any]]:
        return _decoded(self._rows("SELECT * FROM manifests ORDER BY seq"), "manifest_json")

    def env_checks(self) -> list[dict[str, Any]]:
        return _decoded(self._rows("SELECT * FROM env_checks ORDER BY seq"), "check_json")

    def phase_metrics(self) -> dict[int, dict[str, Any]]:
        """seq -> phase_metrics.json of its first host (a run file, docs/results.md); {} for stores without any."""
        out: dict[int, dict[str, Any]] = {}
        for seq, content in self.conn.execute(
                "SELECT seq, content FROM run_files WHERE name = 'phase_metrics.json' ORDER BY seq, host"):
            try:
                val = json.loads(content)
            except json.JSONDecodeError:
                continue
            if isinstance(val, dict):
                out.setdefault(seq, val)
        return out

    def files(self, seq: int) -> dict[str, str]:
        return {r["name"]: r["content"] for r in self._rows("SELECT name, content FROM run_files WHERE seq=?", (seq,))}


class Store(StoreReads):
    """One experiment's SQLite store."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self.conn = conn
        self._gpu_uuid_column: bool | None = None    # gpu_samples.uuid exists (stores before 2026-11 lack it)
        self._migrated = False

    # ----------------------------------------------------------------- open / create
    @classmethod
    def create(cls, path: str | Path) -> "Store":
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        conn = connect.connect(p)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(SCHEMA)
        conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.commit()
        return cls(p, conn)

    @classmethod
    def open(cls, path: str | Path) -> "Store":
        p = store_file(path)
        conn = connect.connect(p)
        try:
            try:
                conn.execute("PRAGMA foreign_keys=ON")
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            except sqlite3.OperationalError as exc:
                if not connect.cannot_open(exc):
                    raise
                conn.close()                    # on read-only media: read it as it is
                conn = connect.connect_read_only(p)
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{p}: not a specab results store ({exc}).") from None
        if row is None or int(row[0]) not in READABLE_SCHEMA_VERSIONS:
            readable = ", ".join(map(str, READABLE_SCHEMA_VERSIONS))
            raise StoreError(f"{p}: schema version {row[0] if row else '?'}, this specab reads {readable}.")
        return cls(p, conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        # the write lock first (BEGIN IMMEDIATE): a store another program holds is waited for once, boundedly, at the
        # transaction's start, never half-way through it
        with connect.reported(self.path), self.conn:
            if not self.conn.in_transaction:
                self.conn.execute("BEGIN IMMEDIATE")
            if not self._migrated:
                migrate(self.conn)
                self._migrated, self._gpu_uuid_column = True, True
            yield self.conn

    # ----------------------------------------------------------------- writes
    def write_experiment(self, *, id: str, name: str, seed: int, repeats: int, order_mode: str,
                         experiment_file: str, inventory_file: str, config: dict[str, Any], matrix: list[str],
                         argv: list[str], hosts: list[str], specab_version: str | None,
                         git_sha: str | None, options: dict[str, Any] | None = None) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO experiment(id, name, created, status, seed, repeats, order_mode, experiment_file,"
                      " inventory_file, config_json, matrix_json, argv_json, hosts_json, specab_version, git_sha,"
                      " options_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      (id, name, time.time(), "running", seed, repeats, order_mode, experiment_file, inventory_file,
                       _dumps(config), _dumps(matrix), _dumps(argv), _dumps(hosts), specab_version, git_sha,
                       _dumps(options)))

    def write_arms(self, arms: Iterable[dict[str, Any]], first_position: int = 1) -> None:
        """Arms in order of definition; ``first_position``: after the arms written before (a search's later probes)."""
        with self._tx() as c:
            for pos, a in enumerate(arms, start=first_position):
                sa = a["server_args"]
                spec = engines.speculative_view(sa)      # SGLang's speculative_* or vLLM's speculative_config
                c.execute("INSERT INTO arms VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                          (a["name"], pos, int(a["is_baseline"]), a["baseline"], _dumps(sa), _dumps(a["env"]),
                           _dumps(a.get("matrix") or {}), spec.algorithm, spec.steps, spec.topk,
                           spec.draft_tokens))

    def write_plan(self, runs: Iterable[dict[str, Any]], repeats: int | None = None) -> None:
        with self._tx() as c:
            for r in runs:
                c.execute("INSERT INTO plan(seq, run_id, block, position, arm, num_requests, burn_in, instance,"
                          " instance_pos) VALUES (?,?,?,?,?,?,?,?,?)",
                          (r["seq"], r["run_id"], r["block"], r["position"], r["arm"], r.get("num_requests"),
                           int(bool(r.get("burn_in"))), r.get("instance"), r.get("instance_pos") or None))
            if repeats is not None:
                c.execute("UPDATE experiment SET repeats=?", (repeats,))

    def record_design_step(self, *, blocks: int, design: str, more: bool, requests: int | None, reason: str,
                           plan: dict[str, Any] | None = None) -> None:
        """The design's decision once `blocks` blocks were started (another block or not, its requests per run)."""
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO design_steps(blocks, decided, design, more, requests, reason, plan_json)"
                      " VALUES (?,?,?,?,?,?,?)", (blocks, time.time(), design, int(more), requests, reason,
                                                  _dumps(plan)))

    def set_experiment_status(self, status: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE experiment SET status=?, finished=? ", (status, time.time()))

    # ----------------------------------------------------------------- fingerprints

    def set_session_fingerprint(self, fp: str, doc: dict[str, Any], *, forced: bool = False) -> None:
        """The fingerprint this session runs under; the experiment's own one is the first ever set.
        Every run started from now on is marked with it."""
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO fingerprints(fingerprint, doc_json, recorded, forced) VALUES (?,?,?,?)",
                      (fp, _dumps(doc), time.time(), int(forced)))
            c.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('fingerprint', ?)", (fp,))
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('session_fingerprint', ?)", (fp,))

    def start_run(self, *, seq: int, run_id: str, arm: str, block: int, host: str, run_dir: str,
                  runner_ident: str) -> None:
        """Record a run as running, replacing any earlier unfinished attempt of the same seq."""
        with self._tx() as c:
            c.execute("DELETE FROM run_fingerprints WHERE seq=?", (seq,))
            c.execute("INSERT INTO run_fingerprints(seq, fingerprint) SELECT ?, value FROM meta "
                      "WHERE key='session_fingerprint'", (seq,))
            prev = c.execute("SELECT attempt FROM runs WHERE seq=?", (seq,)).fetchone()
            attempt = (prev["attempt"] + 1) if prev else 1
            for table in ("run_phases", "requests", "gpu_samples", "manifests", "env_checks", "run_files"):
                c.execute(f"DELETE FROM {table} WHERE seq=?", (seq,))
            c.execute("DELETE FROM runs WHERE seq=?", (seq,))
            c.execute("INSERT INTO runs(seq, run_id, arm, block, host, attempt, status, started, run_dir, runner_ident)"
                      " VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (seq, run_id, arm, block, host, attempt, RUNNING, time.time(), run_dir, runner_ident))

    def record_phase(self, seq: int, phase: str, started: float, finished: float | None) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO run_phases(seq, phase, started, finished, duration_s) VALUES (?,?,?,?,?)",
                      (seq, phase, started, finished, None if finished is None else finished - started))

    def finish_run(self, seq: int, *, status: str, runner_status: str | None = None, runner_rc: int | None = None,
                   failure_phase: str | None = None, failure_reason: str | None = None,
                   log_tail: str | None = None, partial: bool = False,
                   summary: dict[str, Any] | None = None, load_phases: Any = None,
                   server_info: Any = None, stop: Any = None, gpu_free: Any = None,
                   gpus: int | None = None, server_seq: int | None = None) -> float | None:
        """Record the run's end; returns the GPU-seconds stored for it (what the report's verdict cost adds up).
        ``server_seq``: the run whose server start it measured on (None: its own)."""
        now = time.time()
        with self._tx() as c:
            # the run held its GPUs from its first phase to its last on the node (the run queue's runs start
            # before the controller sees them); without phases, from the controller's start to now
            span = c.execute("SELECT MIN(started) AS a, MAX(COALESCE(finished, started)) AS b FROM run_phases"
                             " WHERE seq=?", (seq,)).fetchone()
            held = (span["b"] - span["a"]) if span["a"] is not None else None
            c.execute("UPDATE runs SET gpus=?, gpu_seconds=COALESCE(?, ?-started)*?, server_seq=? WHERE seq=?",
                      (gpus, held, now, gpus, seq if server_seq is None else server_seq, seq))
            counts = c.execute("SELECT COUNT(*) AS n, COALESCE(SUM(ok), 0) AS k FROM requests"
                               " WHERE seq=? AND warmup=0", (seq,)).fetchone()
            c.execute("UPDATE runs SET status=?, finished=?, duration_s=?-started, failure_phase=?, failure_reason=?,"
                      " log_tail=?, partial=?, n_requests=?, n_ok=?, decode_tok_s_median=?, accept_len_mean=?,"
                      " runner_status=?, runner_rc=?, summary_json=?, load_phases_json=?,"
                      " server_info_json=?, stop_json=?, gpu_free_json=? WHERE seq=?",
                      (status, now, now, failure_phase, failure_reason, log_tail, int(partial), counts["n"],
                       counts["k"], (summary or {}).get("decode_tok_s_median"),
                       (summary or {}).get("accept_len_mean"), runner_status, runner_rc, _dumps(summary),
                       _dumps(load_phases), _dumps(server_info), _dumps(stop), _dumps(gpu_free), seq))
            row = c.execute("SELECT gpu_seconds FROM runs WHERE seq=?", (seq,)).fetchone()
        return None if row is None or row["gpu_seconds"] is None else float(row["gpu_seconds"])

    def record_teardown(self, seq: int, *, stop: Any = None, gpu_free: Any = None) -> None:
        """The stop and GPUs-free records of a run whose teardown ended after its row was finished (a per-run run
        interrupted by the user: the driver's stop is its teardown); a record not given keeps the row's."""
        with self._tx() as c:
            c.execute("UPDATE runs SET stop_json=COALESCE(?, stop_json), gpu_free_json=COALESCE(?, gpu_free_json)"
                      " WHERE seq=?", (_dumps(stop), _dumps(gpu_free), seq))

    def spent_gpu_seconds(self, rerun: Collection[int] = ()) -> tuple[float, int]:
        """(GPU-seconds, runs) recorded so far, the runs of the seqs in `rerun` left out: a run started again
        replaces its row (start_run), so what it spent before is no longer part of the experiment's verdict cost."""
        with self._tx() as c:           # (a store written before the cost columns gains them: nothing recorded)
            rows = c.execute("SELECT seq, gpu_seconds FROM runs WHERE gpu_seconds IS NOT NULL").fetchall()
        skip = set(rerun)
        kept = [float(r["gpu_seconds"]) for r in rows if r["seq"] not in skip]
        return sum(kept), len(kept)

    def add_requests(self, seq: int, host: str, records: Iterable[dict[str, Any]]) -> int:
        n = 0
        with self._tx() as c:
            for line, rec in enumerate(records):
                extra = {k: v for k, v in rec.items()
                         if k not in REQUEST_FIELDS and k not in ("chunk_t_s", "chunk_tokens")}
                c.execute("INSERT OR REPLACE INTO requests VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          (seq, host, line, rec.get("i"), int(bool(rec.get("warmup"))), int(bool(rec.get("ok"))),
                           *(rec.get(k) for k in REQUEST_FIELDS[3:]), _dumps(rec.get("chunk_t_s")),
                           _dumps(rec.get("chunk_tokens")), _dumps(extra) if extra else None))
                n += 1
        return n

    def add_gpu_samples(self, seq: int, host: str, csv_text: str) -> int:
        _header, columns, rows = gpu_csv_rows(csv_text)
        if not any(columns):     # headerless: nothing we can map reliably
            return 0
        with self._tx() as c:           # (an older store gains the uuid column: its old rows keep NULL)
            for vals, raw in rows:
                c.execute("INSERT INTO gpu_samples(seq, host, ts, gpu, sm_clock_mhz, mem_clock_mhz, max_sm_clock_mhz,"
                          " power_w, temp_c, util_pct, mem_used_mib, throttle_reasons, raw_json, uuid)"
                          " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          (seq, host, vals.get("ts"), None if vals.get("gpu") is None else int(vals["gpu"]),
                           vals.get("sm_clock_mhz"), vals.get("mem_clock_mhz"), vals.get("max_sm_clock_mhz"),
                           vals.get("power_w"), vals.get("temp_c"), vals.get("util_pct"), vals.get("mem_used_mib"),
                           vals.get("throttle_reasons"), _dumps(raw), vals.get("uuid")))
        return len(rows)

    def add_manifest(self, seq: int, host: str, manifest: dict[str, Any]) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO manifests VALUES (?,?,?)", (seq, host, _dumps(manifest)))

    def add_env_check(self, seq: int, host: str, check: dict[str, Any]) -> None:
        ok = check.get("ok")
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO env_checks VALUES (?,?,?,?)",
                      (seq, host, None if ok is None else int(bool(ok)), _dumps(check)))

    def add_file(self, seq: int, host: str, name: str, content: str) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO run_files VALUES (?,?,?,?)", (seq, host, name, content))


    def mark_running(self) -> None:
        """A resumed experiment runs again (its finish time stays until it finishes again)."""
        with self._tx() as c:
            c.execute("UPDATE experiment SET status='running'")
