"""Benchmark 2: the benchmark client's numbers against ground truth.

    python bench/client_fidelity.py [--concurrency 1 8 64] [--output-len 128] [--gap-ms 10]

A ground-truth server runs in its own process (aiohttp, like a real engine's HTTP front end). It
streams SGLang ``/generate`` SSE chunks in the shape of speculative decoding: after a prefill
delay, one chunk per verify step every ``--gap-ms`` carrying 1..``--max-chunk`` tokens, and it
records when it wrote each chunk (time.perf_counter = CLOCK_MONOTONIC, shared by the processes
of one machine). ``specab/node/loadgen.py`` then runs against it as a separate process, exactly as on
a node, and its bench.jsonl/bench_summary.json are compared with the server's record:

* per-request decode tok/s: client (tokens after the first chunk / client first->last chunk span)
  vs server (same tokens / server first->last emit span): median and max |error| %;
* TTFT: client (send -> first chunk read) vs truth (the client's send, on the shared monotonic
  clock, -> the server wrote the first chunk); the difference is the client's delivery lag;
* delivery lag of every chunk: client read time - server write time (median, p99);
* output tok/s of the run: client (tokens / client duration) vs truth (tokens / first send ->
  last chunk written);
* the client's CPU seconds per 1,000 tok/s of output.

Prints one JSON object. Targets: <= 0.5 % error at concurrency 1, <= 2 % at 64.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NODE = REPO / "specab" / "node"


# ----------------------------------------------------------------------------------------------
# ground-truth server (runs in its own process: --serve)


def serve(port_file: str, truth_file: str, prefill_ms: float, gap_ms: float, max_chunk: int) -> None:
    from aiohttp import web

    out = open(truth_file, "a", encoding="utf-8")

    async def generate(request: web.Request) -> web.StreamResponse:
        t_recv = time.perf_counter()
        body = await request.json()
        n_out = int(body["sampling_params"]["max_new_tokens"])
        prompt = body["text"]
        rng = random.Random(prompt)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        emits = []
        total = 0
        verify = 0
        due = t_recv + prefill_ms / 1000.0
        while total < n_out:
            n = 1 if total == 0 else min(n_out - total, rng.randint(1, max_chunk))
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            total += n
            verify += 1
            meta = {"id": "x", "prompt_tokens": len(prompt.split()), "completion_tokens": total,
                    "finish_reason": None}
            if total >= n_out:
                meta["finish_reason"] = {"type": "length", "length": n_out}
                meta["spec_verify_ct"] = verify
            data = b"data: " + json.dumps({"text": "w" * total, "meta_info": meta}).encode() + b"\n\n"
            emits.append((time.perf_counter(), n))   # stamped as the chunk is handed to the socket
            await resp.write(data)
            due += gap_ms / 1000.0
        await resp.write(b"data: [DONE]\n\n")
        out.write(json.dumps({"prompt": prompt, "t_recv": t_recv, "emits": emits}) + "\n")
        out.flush()
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        Path(port_file + ".tmp").write_text(str(port))
        os.replace(port_file + ".tmp", port_file)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# ----------------------------------------------------------------------------------------------
# the comparison


def _pct(client: float, truth: float) -> float:
    return 100.0 * (client - truth) / truth


def compare(records: list[dict], truths: dict[str, dict], prompts: list[str], summary: dict) -> dict:
    dec_err, ttft_err, ttft_err_ms, lags = [], [], [], []
    t_first, t_last, tokens = None, None, 0
    for rec in records:
        if rec.get("warmup"):
            continue
        if not rec.get("ok"):
            raise RuntimeError("request %s failed: %s" % (rec["i"], rec["error"]))
        truth = truths[prompts[rec["i"]]]
        emits = truth["emits"]
        if rec["chunk_tokens"] != [n for _, n in emits]:
            raise RuntimeError("request %s: client chunk tokens differ from the server's" % rec["i"])
        n_after = sum(n for _, n in emits) - emits[0][1]
        true_dec = n_after / (emits[-1][0] - emits[0][0])
        dec_err.append(_pct(rec["decode_tok_s"], true_dec))
        send = rec["send_mono_s"]
        true_ttft = emits[0][0] - send        # client send -> server wrote the first token
        ttft_err.append(_pct(rec["ttft_s"], true_ttft))
        ttft_err_ms.append(1000.0 * (rec["ttft_s"] - true_ttft))
        lags += [1000.0 * (send + t - e) for t, (e, _) in zip(rec["chunk_t_s"], emits)]
        t_first = send if t_first is None else min(t_first, send)
        t_last = emits[-1][0] if t_last is None else max(t_last, emits[-1][0])
        tokens += sum(n for _, n in emits)
    true_out = tokens / (t_last - t_first)
    lags.sort()
    abs_dec = [abs(e) for e in dec_err]
    return {
        "requests": len(dec_err),
        "chunks": len(lags),
        "decode_tok_s_err_pct_median": statistics.median(abs_dec),
        "decode_tok_s_err_pct_max": max(abs_dec),
        "ttft_err_pct_median": statistics.median([abs(e) for e in ttft_err]),
        "ttft_err_pct_max": max(abs(e) for e in ttft_err),
        "ttft_err_ms_median": statistics.median(ttft_err_ms),
        "ttft_true_ms_median": statistics.median([1000.0 * (truths[prompts[r["i"]]]["emits"][0][0] - r["send_mono_s"])
                                                  for r in records if not r.get("warmup")]),
        "delivery_lag_ms_median": lags[len(lags) // 2],
        "delivery_lag_ms_p99": lags[min(len(lags) - 1, int(len(lags) * 0.99))],
        "output_tok_s_client": summary["output_tok_s"],
        "output_tok_s_true": true_out,
        "output_tok_s_err_pct": _pct(summary["output_tok_s"], true_out),
        "client_cpu_s": summary["client_cpu_s"],
        "duration_s": summary["duration_s"],
        "client_cpu_s_per_1k_tok_s": summary["client_cpu_s_per_1k_tok_s"],
        "client_cpu_share_of_one_core": summary["client_cpu_s"] / summary["duration_s"],
    }


def run_level(concurrency: int, ns: argparse.Namespace, tmp: Path) -> dict:
    truth_file = tmp / f"truth-{concurrency}.jsonl"
    port_file = tmp / f"port-{concurrency}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), str(truth_file),
                               str(ns.prefill_ms), str(ns.gap_ms), str(ns.max_chunk)])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ground-truth server did not start (exit %s)" % server.poll())
            time.sleep(0.05)
        port = int(port_file.read_text())
        n = ns.requests_per_slot * concurrency
        out, summ = tmp / f"bench-{concurrency}.jsonl", tmp / f"summary-{concurrency}.json"
        subprocess.run([sys.executable, str(NODE), "loadgen", "--url", f"http://127.0.0.1:{port}", "--api", "generate",
                        "--num-requests", str(n), "--warmup", str(min(concurrency, 4)), "--input-len",
                        str(ns.input_len), "--output-len", str(ns.output_len), "--ignore-eos", "true", "--concurrency", str(concurrency),
                        "--request-rate", "0", "--client-procs", "auto",
                        "--seed", "1", "--timeout", "600", "--out", str(out), "--summary", str(summ)], check=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from specab.node import loadgen# the same file the client ran

    prompts = loadgen.make_prompts(1, "measure", n, ns.input_len)
    truths = {}
    for line in truth_file.read_text().splitlines():
        t = json.loads(line)
        truths[t["prompt"]] = t
    records = [json.loads(line) for line in out.read_text().splitlines()]
    res = compare(records, truths, prompts, json.loads(summ.read_text()))
    res["concurrency"] = concurrency
    return res


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        port_file, truth_file, prefill_ms, gap_ms, max_chunk = sys.argv[2:7]
        serve(port_file, truth_file, float(prefill_ms), float(gap_ms), int(max_chunk))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--requests-per-slot", type=int, default=3, help="measured requests = this x concurrency")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prefill-ms", type=float, default=50.0)
    ap.add_argument("--gap-ms", type=float, default=10.0, help="time between chunks (one verify step)")
    ap.add_argument("--max-chunk", type=int, default=3, help="tokens per chunk are 1..this")
    ns = ap.parse_args()
    result = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpu, "
                         f"Python {platform.python_version()}",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "settings": {k: v for k, v in vars(ns).items()}, "levels": []}
    with tempfile.TemporaryDirectory() as tmp:
        for c in ns.concurrency:
            result["levels"].append(run_level(c, ns, Path(tmp)))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
