"""nvidia-smi for the simulated node: ``python -m specab.sim.smi``.

Answers the forms the harness uses, in nvidia-smi's exact CSV format (driver 580, H200 readings in
the seed's measurements):

    --query-gpu=<fields> --format=csv[,noheader][,nounits] [-i 0,1]
    --query-compute-apps=<fields> --format=csv[,noheader][,nounits]
    -L

An unknown field prints ``Field "<f>" is not a valid field to query.`` and exits 2, as nvidia-smi does.
Reads SPECAB_SIM_STATE (the node) only; it never starts anything except the node description.
"""
from __future__ import annotations

import sys
import time
import zlib
from pathlib import Path
from datetime import datetime
from typing import Callable, Optional

from specab.sim.gpustate import GpuNode, state_dir_from_env

DRIVER_VERSION = "580.159.04"

# query name -> (header text, unit shown without nounits)
GPU_FIELDS: dict[str, tuple[str, str]] = {
    "timestamp": ("timestamp", ""),
    "driver_version": ("driver_version", ""),
    "count": ("count", ""),
    "index": ("index", ""),
    "name": ("name", ""), "gpu_name": ("name", ""),
    "uuid": ("uuid", ""), "gpu_uuid": ("uuid", ""),
    "serial": ("serial", ""), "gpu_serial": ("serial", ""),
    "pci.bus_id": ("pci.bus_id", ""), "gpu_bus_id": ("pci.bus_id", ""),
    "persistence_mode": ("persistence_mode", ""),
    "pstate": ("pstate", ""),
    "fan.speed": ("fan.speed [%]", "%"),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.reserved": ("memory.reserved [MiB]", "MiB"),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "utilization.memory": ("utilization.memory [%]", "%"),
    "temperature.gpu": ("temperature.gpu", ""),
    "temperature.memory": ("temperature.memory", ""),
    "power.draw": ("power.draw [W]", "W"),
    "power.draw.instant": ("power.draw.instant [W]", "W"),
    "power.limit": ("power.limit [W]", "W"),
    "clocks.sm": ("clocks.current.sm [MHz]", "MHz"), "clocks.current.sm": ("clocks.current.sm [MHz]", "MHz"),
    "clocks.gr": ("clocks.current.graphics [MHz]", "MHz"),
    "clocks.current.graphics": ("clocks.current.graphics [MHz]", "MHz"),
    "clocks.mem": ("clocks.current.memory [MHz]", "MHz"),
    "clocks.current.memory": ("clocks.current.memory [MHz]", "MHz"),
    "clocks.max.sm": ("clocks.max.sm [MHz]", "MHz"), "clocks.max.graphics": ("clocks.max.graphics [MHz]", "MHz"),
    "clocks.max.mem": ("clocks.max.memory [MHz]", "MHz"), "clocks.max.memory": ("clocks.max.memory [MHz]", "MHz"),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", ""),
    "clocks_throttle_reasons.active": ("clocks_event_reasons.active", ""),
    "ecc.errors.uncorrected.volatile.total": ("ecc.errors.uncorrected.volatile.total", ""),
    "compute_mode": ("compute_mode", ""),
    "mig.mode.current": ("mig.mode.current", ""),
}

APP_FIELDS: dict[str, tuple[str, str]] = {
    "timestamp": ("timestamp", ""),
    "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "gpu_serial": ("gpu_serial", ""),
    "gpu_uuid": ("gpu_uuid", ""),
    "pid": ("pid", ""),
    "process_name": ("process_name", ""), "name": ("process_name", ""),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"), "used_memory": ("used_gpu_memory [MiB]", "MiB"),
}


class SmiUsage(Exception):
    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _timestamp() -> str:
    return datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _gpu_values(node: GpuNode) -> list[dict[str, str]]:
    desc = node.describe()
    now = time.time()
    used = node.memory_used(now)
    busy, clock_ratio, busy_reasons = node.busy_look(now)
    total = int(desc["memory_total_mib"])
    rows = []
    for g in desc["gpus"]:
        i = g["index"]
        look = desc["busy"] if i in busy else desc["idle"]
        wobble = (zlib.crc32(g["uuid"].encode()) % 5)  # stable per-GPU variation, as real boards differ
        mem_used = used.get(i, 0)
        reasons = f"0x{busy_reasons:016x}" if i in busy else "0x0000000000000001"
        sm_clock = int(round(int(look["clocks_sm"]) * clock_ratio)) if i in busy else int(look["clocks_sm"])
        power = float(look["power_w"]) + wobble * 0.37
        rows.append({
            "timestamp": _timestamp(), "driver_version": DRIVER_VERSION, "count": str(len(desc["gpus"])),
            "index": str(i), "name": desc["name"], "uuid": g["uuid"],
            "serial": str(1650000000000 + zlib.crc32(g["uuid"].encode()) % 10**9),
            "pci.bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            "persistence_mode": "Enabled", "pstate": "P0", "fan.speed": "[N/A]",
            "memory.total": str(total), "memory.reserved": "616", "memory.used": str(mem_used),
            "memory.free": str(max(0, total - 616 - mem_used)),
            "utilization.gpu": str(look["utilization"]),
            "utilization.memory": str(int(look["utilization"]) // 2),
            "temperature.gpu": str(int(look["temperature_c"]) + wobble),
            "temperature.memory": str(int(look["temperature_c"]) + wobble + 2),
            "power.draw": f"{power:.2f}", "power.draw.instant": f"{power + 1.96:.2f}",
            "power.limit": f"{float(desc['power_limit_w']):.2f}",
            "clocks.sm": str(sm_clock), "clocks.gr": str(sm_clock),
            "clocks.mem": str(look["clocks_mem"]),
            "clocks.max.sm": str(desc["clocks_max_sm"]), "clocks.max.mem": "3201",
            "clocks_event_reasons.active": reasons,
            "ecc.errors.uncorrected.volatile.total": "0",
            "compute_mode": "Default", "mig.mode.current": "Disabled",
        })
    return rows


_GPU_CANON = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_serial": "serial", "gpu_bus_id": "pci.bus_id",
              "clocks.current.sm": "clocks.sm", "clocks.current.graphics": "clocks.gr",
              "clocks.current.memory": "clocks.mem", "clocks.max.graphics": "clocks.max.sm",
              "clocks.max.memory": "clocks.max.mem", "clocks_throttle_reasons.active": "clocks_event_reasons.active"}


def _render(fields: list[str], table: dict[str, tuple[str, str]], rows: list[dict[str, str]],
            header: bool, units: bool, canon: Callable[[str], str]) -> str:
    lines = []
    if header:
        lines.append(", ".join(table[f][0] for f in fields))
    for row in rows:
        cells = []
        for f in fields:
            value = row[canon(f)]
            unit = table[f][1]
            if units and unit and not value.startswith("["):
                value = f"{value} {unit}"
            cells.append(value)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def _parse_fields(spec: str, table: dict[str, tuple[str, str]]) -> list[str]:
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for f in fields:
        if f not in table:
            raise SmiUsage(f'Field "{f}" is not a valid field to query.', 2)
    if not fields:
        raise SmiUsage('Field "" is not a valid field to query.', 2)
    return fields


def _parse_format(spec: Optional[str]) -> tuple[bool, bool]:
    if spec is None:
        raise SmiUsage('"--format" must be specified when querying', 2)
    parts = {p.strip() for p in spec.split(",")}
    if "csv" not in parts or parts - {"csv", "noheader", "nounits"}:
        raise SmiUsage("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)
    return "noheader" not in parts, "nounits" not in parts


def run(argv: list[str]) -> tuple[int, str]:
    opts: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            k, v = arg.split("=", 1)
            opts[k] = v
        elif arg in ("-i", "--id", "--query-gpu", "--query-compute-apps", "--format") and i + 1 < len(argv):
            opts[{"-i": "--id"}.get(arg, arg)] = argv[i + 1]
            i += 1
        elif arg in ("-L", "--list-gpus", "-h", "--help"):
            flags.add(arg)
        else:
            raise SmiUsage("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)
        i += 1
    node = GpuNode(state_dir_from_env())
    if flags & {"-h", "--help"}:
        return 0, "NVIDIA System Management Interface (simulated by specab.sim.smi)\n" \
                  "  --query-gpu=FIELDS --format=csv[,noheader][,nounits] [-i IDS]\n" \
                  "  --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]\n  -L\n"
    if flags & {"-L", "--list-gpus"}:
        return 0, "".join(f"GPU {g['index']}: {node.describe()['name']} (UUID: {g['uuid']})\n"
                          for g in node.describe()["gpus"])
    if "--query-gpu" in opts:
        fields = _parse_fields(opts["--query-gpu"], GPU_FIELDS)
        header, units = _parse_format(opts.get("--format"))
        rows = _gpu_values(node)
        if "--id" in opts:
            wanted = {s.strip() for s in opts["--id"].split(",")}
            rows = [r for r in rows if r["index"] in wanted or r["uuid"] in wanted]
            if not rows:
                return 6, "No devices were found\n"
        return 0, _render(fields, GPU_FIELDS, rows, header, units, lambda f: _GPU_CANON.get(f, f))
    if "--query-compute-apps" in opts:
        fields = _parse_fields(opts["--query-compute-apps"], APP_FIELDS)
        header, units = _parse_format(opts.get("--format"))
        desc = node.describe()
        uuids = {g["index"]: g["uuid"] for g in desc["gpus"]}
        rows = [{"timestamp": _timestamp(), "gpu_name": desc["name"],
                 "gpu_bus_id": f"00000000:{0x18 + 0x10 * a.gpu:02X}:00.0", "gpu_serial": "[N/A]",
                 "gpu_uuid": uuids.get(a.gpu, "[N/A]"), "pid": str(a.pid), "process_name": _process_name(a.pid, a.process_name),
                 "used_gpu_memory": str(a.mib)} for a in node.compute_apps()]
        canon = {"name": "process_name", "used_memory": "used_gpu_memory"}
        return 0, _render(fields, APP_FIELDS, rows, header, units, lambda f: canon.get(f, f))
    return 0, _summary(node)


def _process_name(pid: int, recorded: str) -> str:
    """What the real nvidia-smi shows (H200, driver 580): argv[0] of /proc/PID/cmdline read at query
    time, so a title set with setproctitle (``sglang::scheduler_TP0``) replaces the executable path;
    ``[No data]`` while the process is exiting (empty cmdline)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "[No data]"      # gone, still listed while its context tears down
    first = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return first or "[No data]"


def _summary(node: GpuNode) -> str:
    desc = node.describe()
    used = node.memory_used()
    out = [f"{datetime.now():%a %b %d %H:%M:%S %Y}",
           f"| NVIDIA-SMI {DRIVER_VERSION}   Driver Version: {DRIVER_VERSION}   (simulated node {node.state}) |"]
    for g in desc["gpus"]:
        out.append(f"|  {g['index']}  {desc['name']:<12} {used[g['index']]:>6}MiB / {desc['memory_total_mib']}MiB |")
    out.append("| Processes:")
    for a in node.compute_apps():
        out.append(f"|  {a.gpu}  {a.pid:>8}  C  {_process_name(a.pid, a.process_name)}  {a.mib}MiB |")
    return "\n".join(out) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    try:
        code, text = run(sys.argv[1:] if argv is None else argv)
    except SmiUsage as exc:
        sys.stdout.write(f"{exc}\n")
        return exc.code
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
