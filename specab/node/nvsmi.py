"""nvidia-smi, always under a timeout (a wedged driver makes it hang, even in D state): queries parsed into rows
keyed by the requested fields, and the GPU selection of a tool (stdlib only)."""
from __future__ import annotations

import contextlib
import csv
import io
import os
import shlex
import signal
import subprocess
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from specab.node.cli import ToolError, UsageError
from specab.vocab import contract


DEFAULT_SMI_TIMEOUT = 10.0


class SmiError(ToolError):
    """nvidia-smi failed, hung, or is missing."""


class SmiFieldError(SmiError):
    """nvidia-smi rejected a query field (older/newer driver): ``Field "x" is not a valid field``."""


def run_command(argv: Sequence[str], timeout: float) -> Tuple[int, str, str]:
    """Run ``argv`` in its own session with a hard timeout; never block on a stuck child.

    ``subprocess.run(timeout=...)`` waits for the killed child, which never returns when the child
    is in uninterruptible sleep (nvidia-smi on a wedged GPU): here the child is abandoned after
    SIGKILL plus a short wait. Raises ``subprocess.TimeoutExpired`` on timeout.
    """
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in D state: leave it, we cannot do better
            proc.communicate(timeout=2.0)
        raise
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def smi_call(smi: Sequence[str], args: Sequence[str], timeout: float = DEFAULT_SMI_TIMEOUT) -> str:
    """Run nvidia-smi (the node's argv ``smi``) with ``args``; return stdout or raise SmiError."""
    argv = list(smi) + list(args)
    shown = " ".join(shlex.quote(a) for a in argv)
    try:
        rc, out, err = run_command(argv, timeout)
    except subprocess.TimeoutExpired:
        raise SmiError("nvidia-smi did not answer within %g s: %s (the GPU driver may be wedged: check "
                       "`dmesg` for Xid errors; the node is unhealthy until nvidia-smi answers)"
                       % (timeout, shown))
    except OSError as exc:
        raise SmiError("cannot run nvidia-smi (%s): %s; set specab_smi_cmd to the node's nvidia-smi"
                       % (shown, exc))
    if rc != 0:
        text = (err.strip() or out.strip() or "(no output)").splitlines()
        msg = "; ".join(text[-3:])
        if "is not a valid field" in msg:
            raise SmiFieldError("nvidia-smi rejected a query field (rc %d): %s [%s]" % (rc, msg, shown))
        raise SmiError("nvidia-smi failed (rc %d): %s [%s]" % (rc, msg, shown))
    return out


def parse_smi_csv(text: str, fields: Sequence[str]) -> List[Dict[str, Any]]:
    """Parse ``--format=csv,noheader[,nounits]`` output; columns are mapped by position.

    (Header names differ from query names, e.g. ``clocks.sm`` → ``clocks.current.sm [MHz]``.)
    """
    rows: List[Dict[str, Any]] = []
    for rec in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not rec or all(not c.strip() for c in rec):
            continue
        if len(rec) > len(fields):  # a comma inside the last free-text field: join the tail
            rec = rec[:len(fields) - 1] + [", ".join(rec[len(fields) - 1:])]
        if len(rec) != len(fields):
            raise SmiError("unexpected nvidia-smi output: %d columns for %d fields in %r"
                           % (len(rec), len(fields), ", ".join(rec)))
        rows.append({f: contract.smi_value(c) for f, c in zip(fields, rec)})
    return rows


REASONS_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def query_gpus(smi: Sequence[str], fields: Sequence[str],
               timeout: float = DEFAULT_SMI_TIMEOUT) -> List[Dict[str, Any]]:
    """``--query-gpu`` rows keyed by the requested field names.

    ``clocks_event_reasons.active`` falls back to its old name ``clocks_throttle_reasons.active``
    on drivers that reject it (the row keeps the requested name).
    """
    fields = list(fields)
    try:
        out = smi_call(smi, ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"], timeout)
    except SmiFieldError:
        if REASONS_FIELDS[0] not in fields:
            raise
        alt = [REASONS_FIELDS[1] if f == REASONS_FIELDS[0] else f for f in fields]
        out = smi_call(smi, ["--query-gpu=" + ",".join(alt), "--format=csv,noheader,nounits"], timeout)
    return parse_smi_csv(out, fields)


APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")


def query_compute_apps(smi: Sequence[str], timeout: float = DEFAULT_SMI_TIMEOUT) -> List[Dict[str, Any]]:
    """``--query-compute-apps`` rows (idle GPUs: empty output, rc 0)."""
    out = smi_call(smi, ["--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"],
                   timeout)
    rows = parse_smi_csv(out, APP_FIELDS)
    # process_name is free text: keep it a string even when it looks numeric
    for r in rows:
        if r["process_name"] is not None:
            r["process_name"] = str(r["process_name"])
    return rows


def select_gpus(spec: str, available: Iterable[int]) -> List[int]:
    """``all`` or a comma list (``0,1``) → sorted GPU indices; unknown indices are an error."""
    avail = sorted(set(available))
    if spec.strip().lower() == "all":
        return avail
    try:
        wanted = sorted({int(x) for x in spec.split(",") if x.strip() != ""})
    except ValueError:
        raise UsageError("--gpus must be 'all' or a comma list of GPU indices such as 0,1; got %r" % spec)
    missing = [i for i in wanted if i not in avail]
    if missing:
        raise ToolError("GPU index %s not present on this node (nvidia-smi lists %s); fix specab_gpu_indices"
                        % (",".join(map(str, missing)), ",".join(map(str, avail)) or "no GPU"))
    return wanted
