"""Checks made before the first run of an experiment (issue 6, items 14 and 17).

- Engine flags (item 14): every server argument of every arm is checked against the flags that the
  node's own engine lists in `<engine> --help`, before a model that takes minutes to load is launched.
  The flag list is cached per node and engine version (the engine is not asked again while its version
  is unchanged); when the version cannot be read the engine is asked every time.
- Bind address (item 17): servers bind 127.0.0.1 unless the experiment asks for another address;
  then one warning per address is printed (once, however many arms use it).
- Ports (issue 20, item 5): a port an arm's server would bind that another process already holds on the
  node fails every run; it is refused before the first one, naming the holder (PID, user, command) with
  the node's own check (`specab/node/start.py`, `check_port`, sent to the node and run there).

All only read: `--help` and the port probe start no server and write nothing on the node.
"""
from __future__ import annotations

import base64
import dataclasses
import difflib
import hashlib
import ipaddress
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from specab.config import defaults
from specab.config.inventory import Host
from specab.config.spec import ArmSpec
from specab.config.yamlfile import ConfigError
from specab.driver.remote import RemoteError, open_node
from specab.node import engines

DEFAULT_ENGINE_CMD = ["python3", "-m", "sglang.launch_server"]
NODE_TOOLS = Path(__file__).resolve().parents[1] / "node"
PORT_PROBE_TIMEOUT_S = 60.0
HELP_TIMEOUT_S = 180.0          # SGLang's --help imports torch: tens of seconds on a cold node
VERSION_TIMEOUT_S = 60.0
_DECL = re.compile(r"^ {1,6}(-\S.*)$")      # argparse option declaration lines ("  --tp-size TP_SIZE, ...")
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")
_USAGE_FLAG = re.compile(r"\[(--[A-Za-z0-9][A-Za-z0-9_-]*)")


class PreflightError(ConfigError):
    """An arm cannot run on a node (what, where, what to do); refused before any server starts."""


# --------------------------------------------------------------------------- bind address

def bind_warnings(arms: Iterable[ArmSpec]) -> list[str]:
    """One warning per non-loopback `host` the arms bind to (none when every arm binds loopback)."""
    by_host: dict[str, list[str]] = {}
    for arm in arms:
        host = arm.server_args.get("host")
        if host in (None, "") or _is_loopback(str(host)):
            continue
        by_host.setdefault(str(host), []).append(arm.name)
    return [f"arms {', '.join(names)} bind the server to {host} (server_args.host), not 127.0.0.1: the engine's "
            f"HTTP API (no authentication) is reachable from the network on port(s) "
            f"{_ports(arms, host)}. Remove server_args.host to keep the default 127.0.0.1."
            for host, names in by_host.items()]


def _ports(arms: Iterable[ArmSpec], host: str) -> str:
    ports = sorted({str(a.server_args.get("port", defaults.get("server_port"))) for a in arms if str(a.server_args.get("host")) == host})
    return ", ".join(ports)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- engine flags

def parse_help_flags(text: str) -> set[str]:
    """The long flags an argparse `--help` output declares (usage line and option declarations)."""
    flags: set[str] = set()
    section = "usage"
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":") and not line.startswith("usage"):
            section = "options"
        if section == "usage":
            flags.update(_USAGE_FLAG.findall(line))
            continue
        m = _DECL.match(line)
        if m:
            decl = re.split(r"\s{2,}", m.group(1), maxsplit=1)[0]    # cut the help text after the declaration
            flags.update(_FLAG.findall(decl))
    flags.discard("--help")
    return flags


def flag_of(key: str) -> str:
    return "--" + key.replace("_", "-")


@dataclass(frozen=True)
class EngineFlags:
    host: str
    engine_cmd: tuple[str, ...]
    version: str | None
    flags: frozenset[str]
    cached: bool


def _engine_cmd(host: Host) -> list[str]:
    cmd = host.vars.get("specab_engine_cmd", DEFAULT_ENGINE_CMD)
    return [str(c) for c in (cmd if isinstance(cmd, list) else [cmd])]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "specab" / "engine-flags"


def _cache_file(host: Host, cmd: list[str], version: str) -> Path:
    # the node env is part of the key: the same interpreter with another engine environment (e.g. the
    # simulator's SPECAB_SIM_SGLANG_VERSION) may be another engine build
    env = sorted((str(k), str(v)) for k, v in (host.node_env or {}).items())
    key = hashlib.sha256(json.dumps([host.name, host.address, cmd, version, env]).encode()).hexdigest()[:20]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host.name)[:40]
    return cache_dir() / f"{safe}-{key}.json"


def _engine_version(node: Any, host: Host, cmd: list[str]) -> str | None:
    """The installed version of the engine's package (`python -m pkg.mod` -> pkg), or None."""
    if len(cmd) < 3 or cmd[1] != "-m":
        return None
    pkg = cmd[2].split(".")[0]
    probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    rc, out, _ = node.run([cmd[0], "-c", probe, pkg], timeout=VERSION_TIMEOUT_S, env=host.node_env)
    out = out.strip()
    return f"{pkg} {out}" if rc == 0 and out and "\n" not in out else None


def engine_flags(host: Host, node: Any | None = None) -> EngineFlags:
    """The flags the node's engine accepts, from the cache when its version is unchanged."""
    cmd = _engine_cmd(host)
    own = node is None
    node = node or open_node(host)
    try:
        version = _engine_version(node, host, cmd)
        cache = _cache_file(host, cmd, version) if version else None
        if cache is not None and cache.exists():
            try:
                data = json.loads(cache.read_text())
                return EngineFlags(host.name, tuple(cmd), version, frozenset(data["flags"]), cached=True)
            except (OSError, ValueError, KeyError):
                pass        # a broken cache file is rebuilt below
        rc, out, err = node.run(cmd + ["--help"], timeout=HELP_TIMEOUT_S, env=host.node_env)
    finally:
        if own:
            node.close()
    flags = parse_help_flags(out)
    if rc != 0 or not flags:
        raise EngineHelpUnavailable(
            f"{host.name}: `{' '.join(cmd)} --help` " + (f"exited {rc}" if rc != 0 else "listed no flags")
            + (f": {(err or out).strip().splitlines()[-1]}" if (err or out).strip() else ""))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"host": host.name, "engine_cmd": cmd, "version": version,
                                   "flags": sorted(flags)}))
        tmp.replace(cache)
    return EngineFlags(host.name, tuple(cmd), version, frozenset(flags), cached=False)


def cached_engine_flags(host: Host) -> EngineFlags | None:
    """The newest cached flag list of `host`'s engine, read locally (touches no node), or None."""
    cmd = _engine_cmd(host)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host.name)[:40]
    best: tuple[float, EngineFlags] | None = None
    for path in cache_dir().glob(f"{safe}-*.json"):
        try:
            data = json.loads(path.read_text())
            if data.get("host") != host.name or data.get("engine_cmd") != cmd:
                continue
            ef = EngineFlags(host.name, tuple(cmd), data.get("version"), frozenset(data["flags"]), cached=True)
            mtime = path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or mtime > best[0]:
            best = (mtime, ef)
    return best[1] if best else None


def describe_engine(ef: EngineFlags | None) -> str:
    """One line naming the engine build a plan is rendered for."""
    if ef is None:
        return ("engine build: not yet known (its `--help` is read, read-only and cached, before the first "
                "launch); shown with the experiment's argument names")
    gen = engines.generation_of_flags(ef.flags)
    return (f"engine build: {ef.version or ' '.join(ef.engine_cmd)}, SGLang {gen} flag set "
            f"({len(ef.flags)} flags, fingerprint {engines.flags_fingerprint(ef.flags)}, from the local cache)")


class EngineHelpUnavailable(Exception):
    """The node's engine could not list its flags (the launch itself stays the final check)."""


def unknown_flags(arms: Iterable[ArmSpec], ef: EngineFlags) -> list[str]:
    """One message per (arm, argument) whose flag the node's engine does not list."""
    msgs = []
    for arm in arms:
        try:
            spelled = engines.spell_args(arm.server_args, ef.flags)
        except engines.NoSpelling as exc:
            msgs.append(f"arm {arm.name} on {ef.host} ({ef.version or ' '.join(ef.engine_cmd)}, SGLang "
                        f"{engines.generation_of_flags(ef.flags)} flags): {exc}")
            continue
        for key, value in spelled.items():
            if value is None or value is False:
                continue        # omitted from the command line
            flag = flag_of(key)
            if flag in ef.flags:
                continue
            close = difflib.get_close_matches(flag, sorted(ef.flags), n=1)
            hint = f" (did you mean {close[0]}, i.e. server_args.{close[0][2:].replace('-', '_')}?)" if close else ""
            msgs.append(f"arm {arm.name}: server_args.{key} -> {flag} is not a flag of the engine on {ef.host} "
                        f"({ef.version or ' '.join(ef.engine_cmd)}){hint}")
    return msgs


def spell_arms(arms: Iterable[ArmSpec], results: list[EngineFlags]) -> list[ArmSpec]:
    """The arms with `node_args` in the spelling of the checked node's engine (the first host's: the
    hosts of one server run one engine build); unchanged when no engine listed its flags."""
    if not results:
        return list(arms)
    ef = results[0]
    out = []
    for a in arms:
        try:
            out.append(dataclasses.replace(a, node_args=engines.spell_args(a.server_args, ef.flags)))
        except engines.NoSpelling as exc:
            raise PreflightError(f"arm {a.name} on {ef.host} ({ef.version or ' '.join(ef.engine_cmd)}, SGLang "
                                 f"{engines.generation_of_flags(ef.flags)} flags): {exc}") from None
    return out


def check_engine_flags(arms: list[ArmSpec], hosts: list[Host], notice: Any = None) -> list[EngineFlags]:
    """Refuse (PreflightError) any arm argument that a node's engine does not accept.

    `notice(text)` receives a line when a node's engine cannot list its flags (the check is then skipped
    for that node: the engine itself refuses unknown flags at launch, and the run fails fast)."""
    results = []
    problems: list[str] = []
    for host in hosts:
        try:
            ef = engine_flags(host)
        except (EngineHelpUnavailable, RemoteError, OSError) as exc:
            if notice:
                notice(f"engine flags not checked before launch ({exc}); the engine checks them when it starts.")
            continue
        results.append(ef)
        problems += unknown_flags(arms, ef)
    if problems:
        raise PreflightError("\n".join(problems) + "\nThe engine would refuse these arguments after the launch. "
                             "Fix the names in the experiment file or --matrix (flags as `<engine> --help` lists "
                             "them, with '_' for '-').")
    return results


# --------------------------------------------------------------------------- ports

def endpoints(arms: Iterable[ArmSpec]) -> list[tuple[str, int]]:
    """The (bind address, port) pairs the arms' servers use, each once, in arm order."""
    out: list[tuple[str, int]] = []
    for arm in arms:
        host = arm.server_args.get("host") or "127.0.0.1"
        port = arm.server_args.get("port", defaults.get("server_port"))
        try:
            pair = (str(host), int(port))
        except (TypeError, ValueError):
            continue            # a malformed port is the engine-argument check's concern
        if pair not in out:
            out.append(pair)
    return out


def _port_probe(node_dir: str, pairs: Sequence[tuple[str, int]]) -> str:
    """A `python -c` program that runs the node tools' own port check (start.ports_refused) on the node,
    without needing them installed there yet (the first run installs them)."""
    sources = {name: (NODE_TOOLS / f"{name}.py").read_text() for name in ("contract", "common", "start")}
    payload = base64.b64encode(zlib.compress(json.dumps(sources).encode(), 9)).decode()
    return ("import base64, json, sys, types, zlib\n"
            f"src = json.loads(zlib.decompress(base64.b64decode('{payload}')))\n"
            "for name in ('contract', 'common', 'start'):\n"
            "    m = types.ModuleType(name); m.__file__ = '<specab-preflight>/' + name + '.py'\n"
            "    sys.modules[name] = m\n"
            "    exec(compile(src[name], m.__file__, 'exec'), m.__dict__)\n"
            f"print(json.dumps(sys.modules['start'].ports_refused({node_dir!r}, {[list(p) for p in pairs]!r})))\n")


def ports_refused(host: Host, pairs: Sequence[tuple[str, int]], node: Any | None = None) -> list[str]:
    """Why each (address, port) cannot be bound on `host` now (empty when all can). Raises
    EngineHelpUnavailable when the probe itself cannot run (the start step stays the final check)."""
    own = node is None
    node = node or open_node(host)
    python = str(host.vars.get("specab_python", "python3"))
    try:
        rc, out, err = node.run([python, "-c", _port_probe(host.node_dir, pairs)], timeout=PORT_PROBE_TIMEOUT_S)
    finally:
        if own:
            node.close()
    try:
        problems = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else None
    except ValueError:
        problems = None
    if not isinstance(problems, list):
        tail = (err or out).strip().splitlines()
        raise EngineHelpUnavailable(f"{host.name}: the port check exited {rc}" + (f": {tail[-1]}" if tail else ""))
    return [f"{host.name}: {p}" for p in problems]


def check_ports(arms: list[ArmSpec], hosts: list[Host], notice: Any = None) -> None:
    """Refuse (PreflightError) when a port the arms' servers bind is already taken on a node: every run
    would fail at its start. `hosts` are the hosts that bind the port (the head only, for a server over
    several hosts)."""
    pairs = endpoints(arms)
    problems: list[str] = []
    for host in hosts:
        try:
            problems += ports_refused(host, pairs)
        except (EngineHelpUnavailable, RemoteError, OSError) as exc:
            if notice:
                notice(f"ports not checked before the first run ({exc}); the start step checks them.")
    if problems:
        raise PreflightError("\n".join(problems) + "\nEvery run would fail at its start.")
