"""Build analysis data (Experiment/Run/Request) for tests, with realistic request-level noise."""
from __future__ import annotations

import numpy as np

from specab.analysis.evidence.model import Arm, EnvCheck, EnvVarCheck, Experiment, GpuSample, LogStats, Request, Run

TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
         "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}

BASE_ARGS = {"tp_size": 8, "mem_fraction_static": 0.88, "max_running_requests": 48,
             "disable_overlap_schedule": True, "disable_cuda_graph": False}


def spec_args(steps: int) -> dict:
    return {**BASE_ARGS, "speculative_algorithm": "EAGLE3", "speculative_num_steps": steps,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}


def arms(steps=(2,)) -> list[Arm]:
    return [Arm("baseline", dict(BASE_ARGS), dict(TUNED))] + [
        Arm(f"eagle3-s{k}", spec_args(k), dict(TUNED)) for k in steps]


def requests(tok_s: float, t0: float, n: int = 8, output_tokens: int = 256, accept_len: float | None = None,
             rng: np.random.Generator | None = None, cv: float = 0.003) -> list[Request]:
    rng = rng or np.random.default_rng(0)
    out, t = [], t0
    for i in range(n + 2):
        v = tok_s * (1 + cv * rng.standard_normal())
        e2e = 0.06 + (output_tokens - 1) / v
        vct = round(output_tokens / accept_len) if accept_len else None
        out.append(Request(i=i, warmup=i < 2, ok=True, start_ts=t, prompt_tokens=131, output_tokens=output_tokens,
                           ttft_s=0.06, e2e_s=e2e, decode_tok_s=v, tpot_s=(e2e - 0.06) / (output_tokens - 1),
                           spec_verify_ct=vct, accept_len=output_tokens / vct if vct else None))
        t += e2e + 0.01
    return out


def log_stats(spec: bool, accept_len: float | None, gen_tok_s: float, cuda_graph: bool = True) -> LogStats:
    n = 20
    line = ("[2025-10-22 10:27:57 TP0] Decode batch, #running-req: 1, #token: 186, token usage: 0.00, "
            + (f"accept len: {accept_len:.2f}, accept rate: 0.49, " if spec else "")
            + f"cuda graph: {cuda_graph}, gen throughput (token/s): {gen_tok_s:.2f}, #queue-req: 0")
    return LogStats(cuda_graph_true=n if cuda_graph else 0, cuda_graph_false=0 if cuda_graph else n,
                    accept_len_mean=accept_len if spec else None, gen_tok_s_median=gen_tok_s,
                    no_graph_example=None if cuda_graph else line, nccl_env={})


def env_check(env: dict, missing_in_workers: tuple[str, ...] = ()) -> EnvCheck:
    vs = []
    for k, v in env.items():
        if k in missing_in_workers:
            vs.append(EnvVarCheck(k, v, False, ["/proc/100/environ (sglang::http_server)"],
                                  ["sglang::scheduler_TP0 (pid 101): <unset>"]))
        else:
            vs.append(EnvVarCheck(k, v, True, ["/proc/101/environ (sglang::scheduler_TP0)"]))
    return EnvCheck(variables=vs)


def gpu_samples(t0: float, t1: float, sm: float = 1980, max_sm: float = 1980, reasons: int = 0,
                n: int = 10, gpus: int = 2) -> list[GpuSample]:
    out = []
    for j in range(n):
        ts = t0 + (t1 - t0) * j / max(1, n - 1)
        for g in range(gpus):
            out.append(GpuSample(ts=ts, index=g, uuid=f"GPU-{g:04d}", sm_mhz=sm, max_sm_mhz=max_sm,
                                 util_pct=97, reasons=reasons))
    return out


def experiment(tok_s: dict[str, float], blocks: int = 6, *, accept: dict[str, float] | None = None,
               order: str = "interleaved", drift_per_run: float = 0.0, run_cv: float = 0.004, seed: int = 1,
               run_s: float = 300.0, hosts: tuple[str, ...] = ("localhost",), arm_list: list[Arm] | None = None,
               tweak=None) -> Experiment:
    """An experiment whose arms run at the given tok/s, with per-run noise and an optional drift.

    tweak(run, arm) can modify each run after it is built (to provoke doctor rules)."""
    rng = np.random.default_rng(seed)
    accept = accept or {}
    arm_list = arm_list or [Arm(n, spec_args(int(n[-1])) if n != "baseline" else dict(BASE_ARGS), dict(TUNED))
                            for n in tok_s]
    runs: list[Run] = []
    seq, t = 0, 1.7e9
    names = [a.name for a in arm_list]
    for host in hosts:
        sched = []
        if order == "blocked":
            sched = [(b, n) for n in names for b in range(blocks)]
        else:
            for b in range(blocks):
                perm = list(rng.permutation(names))
                sched += [(b, n) for n in perm]
        for i, (b, n) in enumerate(sched):
            seq += 1
            drift = 1 + drift_per_run * i
            v = tok_s[n] * drift * (1 + run_cv * rng.standard_normal())
            arm = next(a for a in arm_list if a.name == n)
            acc = accept.get(n, 2.1) if arm.is_spec else None
            reqs = requests(v, t + 60, accept_len=acc, rng=rng)
            run = Run(run_id=f"{seq:03d}-{n}", arm=n, seq=seq, block=b, host=host, status="ok",
                      started=t, finished=t + run_s, server_args=dict(arm.server_args), env=dict(arm.env),
                      requests=reqs, log=log_stats(arm.is_spec, acc, v), env_check=env_check(arm.env),
                      gpu_samples=gpu_samples(t + 60, reqs[-1].start_ts + reqs[-1].e2e_s),
                      client_cpu_s=2.0, duration_s=reqs[-1].start_ts + reqs[-1].e2e_s - (t + 60),
                      manifest={"seed": 1})
            if tweak:
                tweak(run, arm)
            runs.append(run)
            t += run_s
    return Experiment(id="test-exp", arms=arm_list, runs=runs, order=order, baseline="baseline", name="test")


# ---------------------------------------------------------------------------------- the results store

SGL_DECODE = ("[2025-10-22 10:27:57 TP0] Decode batch, #running-req: 1, #token: {tok}, token usage: 0.00, "
              "{spec}cuda graph: {graph}, gen throughput (token/s): {gen:.2f}, #queue-req: 0")


def server_log_text(run: Run, lines: int = 6) -> str:
    """A server log in SGLang 0.5.9 format for this run (decode lines as the run's LogStats says)."""
    out = ["[2025-10-22 10:27:40 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
           "avail mem=60.12 GB, mem usage=72.00 GB.",
           "[2025-10-22 10:27:50] The server is fired up and ready to roll!"]
    log = run.log
    for j in range(lines):
        graph = log.cuda_graph_true > 0 if log else True
        spec = (f"accept len: {log.accept_len_mean:.2f}, accept rate: 0.55, "
                if log and log.accept_len_mean is not None else "")
        out.append(SGL_DECODE.format(tok=100 + j, spec=spec, graph=graph, gen=log.gen_tok_s_median if log else 80.0))
    for k, v in run.env.items():
        if k.startswith("NCCL_") and k not in ("NCCL_PROTO", "NCCL_ALGO"):
            out.append(f"host:4242:4242 [0] NCCL INFO {k} set by environment to {v}{'.' if v.isdigit() else ''}")
    return "\n".join(out) + "\n"


def env_check_json(run: Run) -> dict:
    ec = run.env_check
    variables = {}
    for v in (ec.variables if ec else []):
        variables[v.name] = {"expected": v.expected, "evidence": ["environ:101"] if v.confirmed else [],
                             "mismatches": [] if v.confirmed else v.mismatches, "unverified": []}
    return {"ok": not ec.unconfirmed() if ec else True, "variables": variables,
            "args": {"tp_size": {"expected": 8, "actual": 8, "ok": True}}, "processes": []}


def gpu_csv(run: Run) -> str:
    rows = ["timestamp,index,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu,"
            "clocks_event_reasons.active"]
    for s in run.gpu_samples:
        rows.append(f"{s.ts:.3f},{s.index},{s.sm_mhz:.0f},3201,{s.max_sm_mhz:.0f},455,55,{s.util_pct},"
                    f"0x{(s.reasons or 0):016x}")
    return "\n".join(rows) + "\n"


def _scaled(q, scale: float) -> dict:
    d = dict(q.__dict__)
    for k in ("ttft_s", "e2e_s", "tpot_s"):
        if d.get(k) is not None:
            d[k] = d[k] / scale
    if d.get("decode_tok_s") is not None:
        d["decode_tok_s"] = d["decode_tok_s"] * scale
    return d


def write_store(exp: Experiment, root, time_scale: float = 1.0) -> "Path":
    """Write an in-memory experiment into a real results store + run directories, as the driver does."""
    import json as _json
    from pathlib import Path

    from specab.results.store import FILENAME, Store
    d = Path(root) / exp.id
    d.mkdir(parents=True, exist_ok=True)
    st = Store.create(d / FILENAME)
    try:
        st.write_experiment(id=exp.id, name=exp.name or "test", seed=1, repeats=max(r.block for r in exp.runs) + 1,
                            order_mode=exp.order, experiment_file="experiments/default.yml",
                            inventory_file="inventory/local.yml", config={"name": exp.name}, matrix=["steps=2"],
                            argv=["--matrix", "steps=2", "--target-ci", "2%", "--max-repeats", "8"],
                            hosts=sorted({r.host for r in exp.runs}), specab_version="0.1.0", git_sha="abc123")
        st.write_arms([{"name": a.name, "is_baseline": not a.is_spec, "baseline": exp.baseline,
                        "server_args": a.server_args, "env": a.env} for a in exp.arms])
        st.write_plan([{"seq": r.seq, "run_id": r.run_id, "block": r.block + 1, "position": 1, "arm": r.arm}
                       for r in exp.runs])
        for r in exp.runs:
            rd = d / r.run_id
            rd.mkdir(exist_ok=True)
            (rd / "server.log").write_text(server_log_text(r))
            st.start_run(seq=r.seq, run_id=r.run_id, arm=r.arm, block=r.block + 1, host=r.host, run_dir=str(rd),
                         runner_ident=f"{r.seq}")
            st.add_requests(r.seq, r.host, [_scaled(q, time_scale) for q in r.requests])
            st.add_gpu_samples(r.seq, r.host, gpu_csv(r))
            st.add_manifest(r.seq, r.host, {"run_id": r.run_id, "server_args": r.server_args,
                                            "env_file": {"values": r.env}, "seed": 1})
            st.add_env_check(r.seq, r.host, env_check_json(r))
            st.finish_run(r.seq, status=r.status, summary={"client_cpu_s": r.client_cpu_s,
                                                           "duration_s": r.duration_s},
                          server_info={**r.server_args, "internal_states": [{}], "version": "0.5.9",
                                       **({"simulator": {"profile": "default", "time_scale": time_scale}}
                                          if time_scale != 1.0 else {})})
        st.set_experiment_status("finished")
    finally:
        st.close()
    _ = _json
    return d
