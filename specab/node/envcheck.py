#!/usr/bin/env python3
"""Verify that the intended env reached every engine process and the server runs the arm's args.

    envcheck.py --node-dir D --env-file R/nccl.env --url http://H:P --expected-args R/args.json
                --log R/server.log [--log more.log ...] [--out F] [--server-info-out F]
    envcheck.py ... --no-server-info      (a rank without the HTTP API: the environment only)

Engine processes = the main pid recorded in server.json plus all its alive descendants (walk of
/proc/*/stat ppid links). For each variable of the env file, each process's /proc/PID/environ
(the exec-time environment) must hold the expected value; NCCL's ``NCCL INFO <VAR> set by
environment to <value>`` log lines confirm (or contradict) what NCCL itself read. The server args
read back from /server_info (fallback /get_server_info: SGLang 0.5.9) are compared with the arm's
expected args (the node's spelling, SGLang field names), tolerating int/float/str representation
differences; on SGLang 0.5.23 the graph flags (``cuda_graph_max_bs_decode``, ``cuda_graph_backend_*``,
``cuda_graph_bs_*``) are read back from ``cuda_graph_config.<phase>`` (engines.readback). Output:

    {"ok": bool, "variables": {VAR: {"expected", "evidence": [...], "mismatches": [...]}},
     "args": {ARG: {"expected", "actual", "ok"[, "read_from"]}}, "processes": [...],
     "engine": {"version", "generation", "graph_readback", "decode_graph_max_bs", "decode_graph_disabled"},
     "error": "..."}

Secret values (``*_TOKEN``, ``*_KEY``, ``*_SECRET``, ``*PASSWORD*``) are printed as ``<redacted>``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specab.node import cli, envfile, osutil, ownership, procfs
from specab.node.cli import ToolError
from specab.vocab import contract, engines

# "host:pid:tid [dev] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS" (integer params end in '.')
NCCL_RE = re.compile(r"(?:(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+)?(?:\[(?P<dev>\d+)\]\s+)?"
                     r"NCCL INFO (?P<var>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\s*$")
SHELL_COMMS = {"bash", "sh", "dash", "zsh", "ksh", "busybox"}
TP_RE = re.compile(r"(?:^|[^A-Za-z])(?P<tag>(?:DP\d+_)?TP\d+)\b")


@dataclass
class EnvCheckSpec:
    """One environment and server-args check of a running engine."""
    node_dir: str
    env_file: str
    expected_args: str = cli.arg("JSON dict of the arm's server args")
    url: Optional[str] = None           # None only with no_server_info
    no_server_info: bool = cli.arg("check the environment only, no server args: a node of a multi-node server "
                                      "that is not the head serves no /get_server_info", default=False)
    log: List[str] = cli.arg("server log(s) holding NCCL INFO lines", default_factory=list, action="append")
    http_timeout: float = 10.0
    allow_unverified: bool = cli.arg("a variable no evidence confirms in some process (environ wiped, no NCCL "
                                        "line) is a warning instead of a failure", default=False)
    out: Optional[str] = cli.arg("also write the JSON result here (env_check.json)", default=None)
    server_info_out: Optional[str] = cli.arg("write the server info read back (redacted)", default=None)


def parse_args(argv: Optional[Sequence[str]]) -> EnvCheckSpec:
    spec = cli.spec_from_argv(EnvCheckSpec, argv)
    if spec is not None:
        return spec
    p = cli.spec_parser(EnvCheckSpec, "envcheck.py", __doc__)
    a = p.parse_args(argv)
    if not a.url and not a.no_server_info:
        p.error("--url is required (or --no-server-info for a rank without the HTTP API)")
    return EnvCheckSpec(**vars(a))


# --------------------------------------------------------------------------- processes and env

def engine_processes(main_pid: int) -> List[Dict[str, Any]]:
    """Main pid + alive descendants in its session.

    Skipped: wrapper shells (a launch script that did not ``exec``: its environ predates the env
    file) and descendants that started their own session (daemons, not engine processes).
    """
    stats = procfs.all_stats()
    main_st = next((st for st in stats if st.pid == main_pid), None)
    procs = []
    for pid in [main_pid] + procfs.descendants(main_pid, stats):
        st = next((x for x in stats if x.pid == pid), None)
        if st is None or not st.alive:
            continue
        name = procfs.display_name(pid)
        m = TP_RE.search(name)
        skipped = None
        if st.comm in SHELL_COMMS:
            skipped = "wrapper shell"
        elif main_st is not None and st.session != main_st.session:
            skipped = "own session %d (not an engine process)" % st.session
        procs.append({"pid": pid, "name": name, "comm": st.comm, "tag": m.group("tag") if m else None,
                      "skipped": skipped})
    return procs


def shown(var: str, value: Optional[str]) -> str:
    return repr(contract.redact_value(var, value)) if value is not None else "nothing"


def read_environ(pid: int) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    """(environ, None), or (None, why) when it cannot be used as evidence.

    setproctitle (SGLang titles its processes ``sglang::scheduler_TP0``...) overwrites the memory
    that /proc/PID/environ shows with NUL bytes unless ``SPT_NOENV=1`` is in the environment, so
    a title-changed process usually has an empty environ there: that is "unknown", not "missing".
    """
    try:
        env = procfs.proc_environ(pid)
    except OSError as exc:
        return None, "cannot read /proc/%d/environ (%s); run the check as the server's user or root" % (pid, exc)
    if not env:
        return None, ("/proc/%d/environ is empty (setproctitle wiped it; export SPT_NOENV=1 in the launch "
                      "script to keep it readable)" % pid)
    return env, None


def check_environ(expected: Dict[str, str], procs: List[Dict[str, Any]],
                  nccl: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per variable and engine process: the environ value, or (environ unusable) a NCCL echo line
    logged by that very process; a process with neither leaves the variable unverified there."""
    variables: Dict[str, Dict[str, Any]] = {
        v: {"expected": contract.redact_value(v, e), "evidence": [], "mismatches": [], "unverified": []}
        for v, e in expected.items()}
    for p in procs:
        if p["skipped"]:
            continue
        env, why = read_environ(p["pid"])
        p["environ"] = "ok" if env is not None else why
        for v, want in expected.items():
            if env is not None:
                have = env.get(v)
                if have == want:
                    variables[v]["evidence"].append("environ:%d" % p["pid"])
                elif have is None:
                    variables[v]["mismatches"].append(
                        "%s: expected %s in every engine process, but %s (pid %d) does not have it"
                        % (v, shown(v, want), p["name"], p["pid"]))
                else:
                    variables[v]["mismatches"].append(
                        "%s: expected %s in every engine process, but %s (pid %d) has %s"
                        % (v, shown(v, want), p["name"], p["pid"], shown(v, have)))
                continue
            own = [r for r in nccl if r["pid"] == p["pid"] and r["var"] == v]
            if any(nccl_value_matches(want, r["value"]) for r in own):
                continue  # check_nccl records this evidence (and any contradicting line)
            if not own:
                variables[v]["unverified"].append(
                    "%s: cannot verify %s in %s (pid %d): %s, and NCCL logged no line for it from that "
                    "process" % (v, shown(v, want), p["name"], p["pid"], why))
    return variables


# --------------------------------------------------------------------------- NCCL log lines

def parse_nccl_lines(text: str) -> List[Dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if "set by environment to" not in line:
            continue
        m = NCCL_RE.search(line)
        if m:
            out.append({"var": m.group("var"), "value": m.group("value"),
                        "pid": int(m.group("pid")) if m.group("pid") else None,
                        "dev": int(m.group("dev")) if m.group("dev") else None})
    return out


def nccl_value_matches(expected: str, logged: str) -> bool:
    """NCCL prints integer params as ``%lld.`` (decimal, trailing '.') and strings raw."""
    if logged == expected or logged == expected + ".":
        return True
    raw = logged[:-1] if logged.endswith(".") else logged
    try:
        return int(expected, 0) == int(raw, 10)
    except ValueError:
        return False


def check_nccl(expected: Dict[str, str], lines: List[Dict[str, Any]], procs: List[Dict[str, Any]],
               variables: Dict[str, Dict[str, Any]]) -> None:
    by_pid = {p["pid"]: p for p in procs}
    for rec in lines:
        v = rec["var"]
        if v not in expected:
            continue
        p = by_pid.get(rec["pid"]) if rec["pid"] is not None else None
        if p is not None and p["tag"]:
            where = p["tag"]
        elif rec["pid"] is not None:
            where = "pid%d" % rec["pid"] + ("/dev%d" % rec["dev"] if rec["dev"] is not None else "")
        else:
            where = "dev%s" % rec["dev"]
        if nccl_value_matches(expected[v], rec["value"]):
            label = "nccl_log:%s" % where
            if label not in variables[v]["evidence"]:
                variables[v]["evidence"].append(label)
        else:
            variables[v]["mismatches"].append(
                "%s: expected %s, but NCCL in %s reports it was set to %s"
                % (v, shown(v, expected[v]), where, shown(v, rec["value"])))


# --------------------------------------------------------------------------- server args

def fetch_server_info(base: str, timeout: float) -> Tuple[str, Dict[str, Any]]:
    errors = []
    # /server_info first: 0.5.23's path (its /get_server_info is a deprecated alias that logs a warning);
    # SGLang 0.5.9 answers /get_server_info
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as resp:
                info = json.loads(resp.read().decode("utf-8"))
            if engines.is_vllm_dev_server_info(info):     # not SGLang's server args: vLLM's readback applies
                errors.append("%s: vLLM's development route (VLLM_SERVER_DEV_MODE), not SGLang's server args" % path)
                continue
            return path, info
        except urllib.error.HTTPError as exc:
            errors.append("%s: HTTP %d" % (path, exc.code))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            errors.append("%s: %s" % (path, getattr(exc, "reason", exc)))
    raise ToolError("cannot read the server args back from %s (%s); is the server up?"
                    % (base, "; ".join(errors)))


def _num(x: Any) -> Optional[float]:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x.strip())
        except ValueError:
            return None
    return None


def values_equal(expected: Any, actual: Any) -> bool:
    """Equal up to representation: 8 == 8.0 == "8", True == "true", lists element-wise."""
    if expected == actual and type(expected) == type(actual):
        return True
    if isinstance(expected, bool) or isinstance(actual, bool):
        def as_bool(x: Any) -> Optional[bool]:
            if isinstance(x, bool):
                return x
            if isinstance(x, str) and x.strip().lower() in ("true", "false"):
                return x.strip().lower() == "true"
            if isinstance(x, (int, float)) and x in (0, 1):
                return bool(x)
            return None
        be, ba = as_bool(expected), as_bool(actual)
        return be is not None and be == ba
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return len(expected) == len(actual) and all(values_equal(e, a) for e, a in zip(expected, actual))
    ne, na = _num(expected), _num(actual)
    if ne is not None and na is not None:
        return abs(ne - na) <= 1e-9 * max(1.0, abs(ne), abs(na))
    if isinstance(expected, (list, tuple, dict)) or isinstance(actual, (list, tuple, dict)):
        return expected == actual
    return str(expected) == str(actual)


def vllm_readback(base: str, logs: List[str], timeout: float) -> Optional[Dict[str, Any]]:
    """vLLM's server args: the `non-default args` dict of its log, plus the served model of /v1/models
    (`served_model`) and the `model_name` label of /metrics (`metrics_model_name`). None: not a vLLM log."""
    args = None
    for path in logs:
        try:
            with open(path, "r", errors="replace") as fh:
                args = engines.parse_non_default_args(fh.read()) or args
        except OSError:
            continue
    if args is None:
        return None
    info = dict(args)
    try:
        with urllib.request.urlopen(base + "/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read().decode("utf-8")).get("data") or []
        info["served_model"] = data[0].get("id") if data else None
    except (urllib.error.URLError, OSError, ValueError):
        info["served_model"] = None
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=timeout) as resp:
            names = {lab.get("model_name") for _, lab, _ in engines.parse_prometheus(resp.read().decode("utf-8"))}
        info["metrics_model_name"] = sorted(n for n in names if n)
    except (urllib.error.URLError, OSError, ValueError):
        info["metrics_model_name"] = None
    return info


def vllm_expected(expected: Dict[str, Any]) -> Dict[str, Any]:
    """The arm's args under vLLM's field names (model_path is vLLM's `model`)."""
    return {("model" if k == "model_path" else k): v for k, v in expected.items()}


def check_args(expected: Dict[str, Any], info: Dict[str, Any],
               absent_is_default: bool = False) -> Tuple[Dict[str, Any], List[str]]:
    """Per arg: expected vs actual. ``null`` means "not passed" (server default): not compared;
    ``false`` means the flag was omitted: the server must not have it on. ``absent_is_default``
    (vLLM logs only its non-default args): an arg the readback lacks is reported, not failed."""
    report: Dict[str, Any] = {}
    problems: List[str] = []
    for k, want in expected.items():
        secret = contract.is_secret_name(k)
        if want is None:
            report[k] = {"expected": None, "actual": contract.redact_value(k, info.get(k)), "ok": True,
                         "note": "not passed; server default"}
            continue
        found, have, where = engines.readback(k, info)
        if not found and absent_is_default:
            report[k] = {"expected": contract.redact_value(k, want), "actual": None, "ok": True,
                         "note": "not in vLLM's non-default args: equal to vLLM's default"}
            continue
        if not found:
            report[k] = {"expected": contract.redact_value(k, want), "actual": None, "ok": False,
                         "note": "the server does not report this arg"}
            problems.append("server arg %s: expected %s, but the server does not report it%s (misspelt or "
                            "not an SGLang field?)" % (k, contract.REDACTED if secret else repr(want),
                                                       "" if where == k else " at %s" % where))
            continue
        ok = values_equal(want, have) or (want is False and have in (None, False, 0, "", "false", "False"))
        report[k] = {"expected": contract.redact_value(k, want), "actual": contract.redact_value(k, have), "ok": ok}
        if where != k:
            report[k]["read_from"] = where      # 0.5.23: the graph flags resolve into cuda_graph_config
        if not ok:
            problems.append("server arg %s: expected %s, but the server runs with %s"
                            % (k, contract.REDACTED if secret else repr(want),
                               contract.REDACTED if secret else repr(have)))
    return report, problems


def engine_readback(info: Dict[str, Any]) -> Dict[str, Any]:
    """The engine version the server reported, its generation and its resolved decode graph settings."""
    version = info.get("version") if isinstance(info.get("version"), str) else None
    gen = engines.generation_of_version(version) if version else None
    if gen is None:
        gen = engines.SGLANG_0_5_23 if isinstance(info.get("cuda_graph_config"), dict) else engines.SGLANG_0_5_9
    return {"version": version, "generation": gen,
            "graph_readback": "cuda_graph_config" if isinstance(info.get("cuda_graph_config"), dict) else "flat",
            "decode_graph_max_bs": engines.graph_max_bs(info), "decode_graph_disabled": engines.graph_disabled(info)}


# --------------------------------------------------------------------------- main

def check(a: EnvCheckSpec) -> Dict[str, Any]:
    node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    rec = ownership.load_record(node_dir)
    if rec is None:
        raise ToolError("no server recorded in %s/server.json; start the server first" % node_dir)
    if not ownership.main_is_ours(rec):
        raise ToolError("the recorded server (pid %s) is not running; see its log %s"
                        % (rec["pid"], rec.get("log", "server.log")))
    expected_env = envfile.parse_env_file(a.env_file)
    try:
        expected_args = osutil.read_json(a.expected_args)
    except (OSError, ValueError) as exc:
        raise ToolError("cannot read the expected args %s: %s" % (a.expected_args, exc))
    if not isinstance(expected_args, dict):
        raise ToolError("%s must hold a JSON object of server args" % a.expected_args)

    procs = engine_processes(int(rec["pid"]))
    nccl_lines: List[Dict[str, Any]] = []
    # the server's own log where it is another file than those given: a server kept across the loads of an
    # instance (instance.py) writes on into its instance's log, whose start holds the lines of its start
    logs = list(a.log)
    live = rec.get("log")
    if isinstance(live, str) and live and os.path.exists(live) \
            and os.path.abspath(live) not in [os.path.abspath(p) for p in logs]:
        logs.append(live)
    a = dataclasses.replace(a, log=logs)
    for path in a.log:
        try:
            with open(path, "r", errors="replace") as fh:
                nccl_lines += parse_nccl_lines(fh.read())
        except OSError as exc:
            cli.log("warning: cannot read log %s: %s" % (path, exc))
    variables = check_environ(expected_env, procs, nccl_lines)
    check_nccl(expected_env, nccl_lines, procs, variables)

    if a.no_server_info:
        endpoint, args_report, arg_problems = None, {}, []
    else:
        try:
            endpoint, info = fetch_server_info(a.url.rstrip("/"), a.http_timeout)
            vllm = False
        except ToolError as no_info:
            # vLLM has no /server_info: its `non-default args: {...}` log line, /v1/models and /metrics
            readback = vllm_readback(a.url.rstrip("/"), a.log, a.http_timeout)
            if readback is None:
                raise no_info
            endpoint, info, vllm = "log:non-default args", readback, True
        if a.server_info_out:
            osutil.write_json(a.server_info_out, contract.redact_mapping(info))
        args_report, arg_problems = check_args(vllm_expected(expected_args) if vllm else expected_args, info,
                                               absent_is_default=vllm)

    env_problems = [m for v in variables.values() for m in v["mismatches"]]
    unverified = [m for v in variables.values() for m in v["unverified"]]
    if not a.allow_unverified:
        env_problems += unverified
    out: Dict[str, Any] = {
        "ok": not env_problems and not arg_problems,
        "variables": variables,
        "args": args_report,
        "server_info_endpoint": endpoint,
        "engine": None if a.no_server_info else engine_readback(info),
        "processes": [{"pid": p["pid"], "name": p["name"], "skipped": p["skipped"],
                       "environ": p.get("environ")} for p in procs],
        "nccl_lines": len(nccl_lines),
    }
    if not out["ok"]:
        problems = env_problems + arg_problems
        more = "" if len(problems) <= 8 else " (and %d more)" % (len(problems) - 8)
        raise ToolError("; ".join(problems[:8]) + more, out)
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    return cli.recorded(a.out, lambda: check(a))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
