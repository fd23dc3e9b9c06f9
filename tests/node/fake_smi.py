"""A canned nvidia-smi for parser and failure tests: prints lines copied from a real H200.

    python fake_smi.py --mode MODE [nvidia-smi args...]

MODE: ``h200`` (answers --query-gpu / --query-compute-apps with the real lines of
shared/reference/vllm-sim-nvidia-smi-nccl.md C1, one torch process holding 8710 MiB), ``old``
(like h200 but rejects ``clocks_event_reasons.active`` as drivers before the rename do),
``hang`` (never answers), ``fail`` (exits 9 with an NVML error).
"""
import sys
import time

UUID = "GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35"
# real: index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu,clocks.sm,clocks.mem,power.draw,reasons
REAL = {"index": "0", "uuid": UUID, "name": "NVIDIA H200", "memory.used": "0", "memory.total": "143771",
        "utilization.gpu": "0", "temperature.gpu": "37", "clocks.sm": "375", "clocks.mem": "3201",
        "power.draw": "117.18", "clocks_event_reasons.active": "0x0000000000000001",
        "clocks_throttle_reasons.active": "0x0000000000000001", "clocks.max.sm": "1980",
        "driver_version": "580.159.04", "fan.speed": "[N/A]"}


def main(argv):
    mode = argv[argv.index("--mode") + 1]
    args = [a for a in argv if not a.startswith("--mode") and a != mode]
    if mode == "hang":
        time.sleep(3600)
    if mode == "fail":
        sys.stdout.write("Failed to initialize NVML: Driver/library version mismatch\n")
        return 9
    for a in args:
        if a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1].split(",")
            for f in fields:
                if f not in REAL or (mode == "old" and f == "clocks_event_reasons.active"):
                    sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % f)
                    return 2
            sys.stdout.write(", ".join(REAL[f] for f in fields) + "\n")
            return 0
        if a.startswith("--query-compute-apps="):
            sys.stdout.write("430, python3, 8710, %s\n" % UUID)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
