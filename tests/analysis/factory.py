"""Build analysis data (Experiment/Run/Request) for tests, with realistic request-level noise."""
from __future__ import annotations

import numpy as np

from specab.analysis import Arm, EnvCheck, EnvVarCheck, Experiment, GpuSample, LogStats, Request, Run

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
    return LogStats(decode_lines=n, cuda_graph_true=n if cuda_graph else 0, cuda_graph_false=0 if cuda_graph else n,
                    accept_len_mean=accept_len if spec else None, gen_tok_s_mean=gen_tok_s,
                    no_graph_example=None if cuda_graph else line, nccl_env={})


def env_check(env: dict, missing_in_workers: tuple[str, ...] = ()) -> EnvCheck:
    vs = []
    for k, v in env.items():
        if k in missing_in_workers:
            vs.append(EnvVarCheck(k, v, False, ["/proc/100/environ (sglang::http_server)"],
                                  ["sglang::scheduler_TP0 (pid 101): <unset>"]))
        else:
            vs.append(EnvVarCheck(k, v, True, ["/proc/101/environ (sglang::scheduler_TP0)"]))
    return EnvCheck(ok=not missing_in_workers, variables=vs)


def gpu_samples(t0: float, t1: float, sm: float = 1980, max_sm: float = 1980, reasons: int = 0,
                n: int = 10, gpus: int = 2) -> list[GpuSample]:
    out = []
    for j in range(n):
        ts = t0 + (t1 - t0) * j / max(1, n - 1)
        for g in range(gpus):
            out.append(GpuSample(ts=ts, index=g, uuid=f"GPU-{g:04d}", sm_mhz=sm, max_sm_mhz=max_sm,
                                 util_pct=97, power_w=455, reasons=reasons))
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
