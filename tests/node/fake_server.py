"""A small stand-in for an engine server, for the node-tool tests (not the simulator).

    python fake_server.py --config cfg.json [--any-sglang-arg value ...]

Behaves like the parts of SGLang the node tools touch: logs SGLang-format lines
(``[YYYY-mm-dd HH:MM:SS TP0] Load weight begin. ...``), spawns one worker per TP rank that holds
simulated GPU memory (``python -m specab.sim.hold`` with an ``sglang::scheduler_TP{r}`` title, so
``python -m specab.sim.smi`` lists it as a compute process), prints NCCL env-echo lines for the
NCCL_* variables of each worker's environment, and serves /health_generate (503 until loaded),
/get_server_info (the SGLang args it was given, numbers as numbers).

Faults (config "fault"): "oom" (logs SGLang's OOM error and exits 1), "ignore_sigterm" (the main
process ignores SIGTERM), "orphan_workers" (workers run in their own process group, so a SIGTERM
to the server's group misses them, and they outlive the main process), "die_during_load" (exits
silently while loading), "exit_after_load".
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(msg: str, rank: str = " TP0") -> None:
    sys.stdout.write("[%s%s] %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), rank, msg))
    sys.stdout.flush()


def parse_sglang_args(argv: list) -> dict:
    args, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            sys.stderr.write("usage: fake_server.py [--config F] [--flag value ...]\n"
                             "fake_server.py: error: unrecognized arguments: %s\n" % a)
            sys.exit(2)
        key = a[2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            raw = argv[i + 1]
            try:
                val = json.loads(raw)
            except ValueError:
                val = raw
            args[key] = val
            i += 2
        else:
            args[key] = True
            i += 1
    return args


def main() -> int:
    args = parse_sglang_args(sys.argv[1:])
    with open(args.pop("config")) as fh:
        cfg = json.load(fh)
    fault = cfg.get("fault", "")
    if "bogus_flag" in args:
        sys.stderr.write("usage: launch_server.py [-h] --model-path MODEL_PATH ...\n"
                         "launch_server.py: error: unrecognized arguments: --bogus-flag\n")
        return 2
    if fault == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    tp = int(args.get("tp_size", 1))
    log("server_args=ServerArgs(model_path='%s', tp_size=%d)" % (args.get("model_path", ""), tp), "")
    log("Load weight begin. avail mem=139.45 GB")
    if fault == "oom":
        time.sleep(float(cfg.get("load_s", 0.2)))
        log("Scheduler hit an exception: Traceback (most recent call last):")
        sys.stdout.write('  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", '
                         'line 1345, in init_memory_pool\n')
        sys.stdout.write("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n")
        sys.stdout.flush()
        return 1

    workers = []
    for r in range(tp):
        env = dict(os.environ)
        for k in cfg.get("drop_env_in_worker", {}).get(str(r), []):
            env.pop(k, None)
        cmd = [sys.executable, "-m", "specab.sim.hold", "--gpu", str(r % int(cfg.get("gpus", tp))),
               "--mib", str(cfg.get("mib", 1000)), "--title", "sglang::scheduler_TP%d" % r,
               "--release-lag", str(cfg.get("release_lag", 0.15))]
        kw = {"process_group": 0} if fault == "orphan_workers" else {}
        workers.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        **kw))
        workers[-1].stdout.readline()  # "holding ...": registered on its GPU (SGLang waits for its schedulers)
        if env.get("NCCL_DEBUG") == "INFO":
            host = os.uname().nodename
            for k in sorted(env):
                if k.startswith("NCCL_") and k != "NCCL_DEBUG":
                    dot = "" if k in ("NCCL_PROTO", "NCCL_ALGO") or not env[k].isdigit() else "."
                    sys.stdout.write("%s:%d:%d [%d] NCCL INFO %s set by environment to %s%s\n"
                                     % (host, workers[-1].pid, workers[-1].pid + 7, r, k, env[k], dot))
            sys.stdout.flush()
    time.sleep(float(cfg.get("load_s", 0.2)))
    if fault == "die_during_load":
        os._exit(7)  # no fatal line: only the process exit tells
    log("Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=120.31 GB, "
        "mem usage=19.14 GB.")
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=20.40 GB")
    time.sleep(float(cfg.get("graph_s", 0.1)))
    log("Capture cuda graph end. Time elapsed: 0.10 s. mem usage=1.02 GB. avail mem=19.38 GB.")

    state = {"ready": False}
    info = dict(args)
    info.update(cfg.get("server_info_override", {}))
    info["version"] = "0.5.2-fake"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # keep the log SGLang-like
            pass

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            if self.path in ("/health", "/health_generate"):
                self._send(200 if state["ready"] else 503, b"")
            elif self.path in ("/get_server_info", "/server_info") and self.path not in cfg.get("missing", []):
                self._send(200, json.dumps(info).encode())
            else:
                self._send(404, b'{"detail":"Not Found"}')

    srv = ThreadingHTTPServer((args.get("host", "127.0.0.1"), int(args["port"])), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["ready"] = True
    log("The server is fired up and ready to roll!", "")
    if fault == "exit_after_load":
        return 3
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
