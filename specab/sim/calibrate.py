"""Measure the simulator against its calibration targets: ``python -m specab.sim.calibrate``.

Starts one simulated TP8 server per arm (in a temporary state dir, at a time scale), streams
single-stream 256-token requests with a stdlib client, and prints target vs measured as a Markdown
table (the table in docs/validation/simulator.md comes from this command). tok/s is the seed's definition:
(output tokens - 1) / (t_last_token - t_first_token), reported at time scale 1.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specab.sim.launch_server import free_port

TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
         "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
COMMON = ["--model-path", "/models/Kimi-K2.5-INT4", "--tp-size", "8", "--mem-fraction-static", "0.88",
          "--disable-custom-all-reduce", "--trust-remote-code"]


def spec_args(steps: int) -> list[str]:
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle3",
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)]


@dataclass(frozen=True)
class Arm:
    name: str
    args: list[str]
    env: dict[str, str]
    target_tok_s: Optional[float]
    target_accept: Optional[float]


ARMS = [
    Arm("baseline, tuned NCCL", [], TUNED, 82.2, None),
    Arm("baseline, NCCL not tuned", [], {}, 63.0, None),
    Arm("EAGLE-3 steps=2 topk=1 draft=3", spec_args(2), TUNED, 60.5, 2.10),
    Arm("EAGLE-3 steps=1", spec_args(1), TUNED, None, None),
    Arm("EAGLE-3 steps=3", spec_args(3), TUNED, 60.0, None),
]


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _stream(port: int, i: int, output_len: int) -> tuple[float, float]:
    body = json.dumps({"text": f"request {i}: " + "lorem ipsum dolor sit amet " * 25, "stream": True,
                       "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    times: list[float] = []
    last: dict = {}
    try:
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        for line in resp:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                last = json.loads(line[6:])
                times.append(time.monotonic())
    finally:
        conn.close()
    meta = last["meta_info"]
    n = meta["completion_tokens"]
    accept = n / meta["spec_verify_ct"] if meta.get("spec_verify_ct") else float("nan")
    return (n - 1) / (times[-1] - times[0]), accept


def measure_arm(arm: Arm, requests: int, scale: float, output_len: int, root: Path) -> dict:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPECAB_SIM_", "SGLANG_"))}
    env.update(arm.env)
    env.update({"SPECAB_SIM_STATE": str(root / f"node-{port}"), "SPECAB_SIM_TIME_SCALE": str(scale)})
    argv = [sys.executable, "-m", "specab.sim.launch_server", *COMMON, *arm.args, "--port", str(port)]
    with open(root / f"server-{port}.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{arm.name}: server exited rc={proc.returncode}; see {log.name}")
            with contextlib.suppress(OSError):
                if _get(port, "/health_generate")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{arm.name}: server not ready in 120 s")
            time.sleep(0.05)
        info = json.loads(_get(port, "/server_info")[1])
        rates, accepts = zip(*(_stream(port, i, output_len) for i in range(requests)))
        return {"arm": arm.name, "target_tok_s": arm.target_tok_s, "target_accept": arm.target_accept,
                "true_tok_s": info["simulator"]["true_decode_tok_s"] / scale,
                "tok_s_mean": statistics.fmean(rates) / scale, "tok_s_median": statistics.median(rates) / scale,
                "tok_s_sd": (statistics.stdev(rates) / scale) if len(rates) > 1 else 0.0,
                "accept_mean": statistics.fmean(accepts), "requests": requests, "scale": scale}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def table(rows: list[dict]) -> str:
    def f(x: Optional[float], nd: int = 1) -> str:
        return "—" if x is None or x != x else f"{x:.{nd}f}"
    out = ["| arm | target tok/s | model truth tok/s | measured tok/s (mean ± sd) | target accept len | "
           "measured accept len |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['arm']} | {f(r['target_tok_s'])} | {f(r['true_tok_s'])} | "
                   f"{f(r['tok_s_mean'])} ± {f(r['tok_s_sd'])} | {f(r['target_accept'], 2)} | "
                   f"{f(r['accept_mean'], 2)} |")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specab.sim.calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20, help="measured requests per arm (default 20)")
    p.add_argument("--scale", type=float, default=10.0, help="SPECAB_SIM_TIME_SCALE (default 10)")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--json", action="store_true", help="print JSON rows instead of the Markdown table")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specab-calibrate-") as tmp:
        rows = [measure_arm(arm, a.requests, a.scale, a.output_len, Path(tmp)) for arm in ARMS]
    print(json.dumps(rows, indent=1) if a.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
