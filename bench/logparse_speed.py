"""Benchmark 4: parse a large generated SGLang log for decode statistics.

    python bench/logparse_speed.py [--size-mb 1024] [--also-mb 128] [--dir /tmp] [--records-mb 64]

Generates a log of real line formats (SGLang 0.5.2 ``Decode batch.`` and 0.5.9 ``Decode batch,``
lines with the exact field layout of those versions, Prefill lines, uvicorn access lines), then
parses it in a fresh child process (so the generator's memory does not count) and reports MB/s
and the child's peak RSS. ``--also-mb`` parses a smaller log the same way to show the memory is
flat in the log size; ``--records-mb`` times the full per-line record parser on a prefix.
Prints one JSON object. Target: >= 100 MB/s on one core, memory flat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from specab.analysis.evidence import logparse
path, mode, limit = sys.argv[2], sys.argv[3], int(sys.argv[4])
t0 = time.perf_counter(); c0 = time.process_time()
if mode == "fast":
    with open(path, "rb") as fh:
        stats = logparse.decode_stats(fh)
    nbytes = __import__("os").path.getsize(path)
else:
    s = logparse.Summary(); nbytes = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            nbytes += len(line)
            rec = logparse.parse_line(line)
            if rec is not None:
                s.add(rec)
            if nbytes >= limit:
                break
    stats = s.to_dict()
wall = time.perf_counter() - t0; cpu = time.process_time() - c0
print(json.dumps({"bytes": nbytes, "wall_s": wall, "cpu_s": cpu,
                  "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "decode_lines": stats["decode_lines"], "accept_len_mean": stats["accept_len_mean"],
                  "cuda_graph_share": stats["cuda_graph_share"]}))
"""


def _lines(rng: random.Random):
    t = 1_750_000_000
    it = 0
    while True:
        t += 1
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
        it += 40
        bs = rng.choice((1, 1, 1, 2, 4, 8))
        acc = rng.uniform(1.5, 3.0)     # tau of 2 steps (K+1 = 3 tokens at most): accept rate tau/3 <= 1
        graph = "True" if rng.random() < 0.9 else "False"
        gen = rng.uniform(55, 95) * bs
        r = rng.random()
        if r < 0.35:   # v0.5.2 (scheduler_metrics_mixin.py), trailing ", "
            yield (f"[{ts} TP0] Decode batch. #running-req: {bs}, #token: {bs * rng.randint(200, 900)}, "
                   f"token usage: {rng.random() * 0.1:.2f}, accept len: {acc:.2f}, cuda graph: {graph}, "
                   f"gen throughput (token/s): {gen:.2f}, #queue-req: 0, \n")
        elif r < 0.70:   # v0.5.9, iter counter, accept rate, no trailing comma
            yield (f"[{ts} TP0] Decode batch [{it}], #running-req: {bs}, #token: {bs * rng.randint(200, 900)}, "
                   f"token usage: {rng.random() * 0.1:.2f}, accept len: {acc:.2f}, accept rate: {acc / 3:.2f}, "
                   f"cuda graph: {graph}, gen throughput (token/s): {gen:.2f}, #queue-req: 0\n")
        elif r < 0.85:
            yield (f"[{ts} TP0] Prefill batch, #new-seq: 1, #new-token: {rng.randint(16, 4096)}, "
                   f"#cached-token: 0, token usage: 0.00, #running-req: {bs - 1}, #queue-req: 0, "
                   f"input throughput (token/s): {rng.uniform(1000, 9000):.2f}, \n")
        else:
            yield (f"[{ts}] INFO:     127.0.0.1:{rng.randint(30000, 60000)} - \"POST /generate HTTP/1.1\" "
                   f"200 OK\n")


def generate(path: Path, size_mb: int, seed: int = 1) -> int:
    target = size_mb << 20
    rng = random.Random(seed)
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        buf: list[str] = []
        for line in _lines(rng):
            buf.append(line)
            written += len(line)
            if len(buf) >= 10000:
                fh.write("".join(buf))
                buf.clear()
            if written >= target:
                break
        fh.write("".join(buf))
    return written


def parse_in_child(path: Path, mode: str, limit: int = 0) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(path), mode, str(limit)],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    res["mb_per_s"] = res["bytes"] / (1 << 20) / res["wall_s"]
    res["mb_per_cpu_s"] = res["bytes"] / (1 << 20) / res["cpu_s"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--also-mb", type=int, default=128, help="a smaller log, to show memory is flat (0: skip)")
    ap.add_argument("--records-mb", type=int, default=64, help="time the per-line record parser on this prefix")
    ap.add_argument("--dir", default=None, help="where to write the generated logs (deleted afterwards)")
    ap.add_argument("--keep", action="store_true")
    ns = ap.parse_args()
    result: dict = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpu, "
                               f"Python {platform.python_version()}",
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        for key, mb in (("large", ns.size_mb), ("small", ns.also_mb)):
            if not mb:
                continue
            path = Path(tmp) / f"server-{mb}mb.log"
            t0 = time.perf_counter()
            generate(path, mb)
            gen_s = time.perf_counter() - t0
            fast = parse_in_child(path, "fast")
            fast["generate_s"] = gen_s
            result[f"fast_{key}_{mb}mb"] = fast
            if key == "large" and ns.records_mb:
                result[f"records_{ns.records_mb}mb"] = parse_in_child(path, "records", ns.records_mb << 20)
            if ns.keep:
                os.link(path, Path(ns.dir or ".") / path.name)
            path.unlink()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
