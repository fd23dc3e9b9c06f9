"""The simulated SGLang server: ``python -m specab.sim.launch_server <SGLang flags>``.

Process tree like SGLang 0.5.x: this main process (HTTP server + tokenizer manager, untitled as in
SGLang), one ``sglang::scheduler_TP{r}`` per local TP rank (``sglang::scheduler`` at TP 1) and one
``sglang::detokenizer``; the SGLang release played is ``SPECAB_SIM_SGLANG_VERSION`` (:mod:`specab.sim.versions`:
0.5.23 default, 0.5.9 kept: flags, log lines, /server_info, meta_info, env and shutdown follow it); the children die with the parent (PR_SET_PDEATHSIG). The port stays closed
while the schedulers "load"; then the HTTP server starts, a warm-up request runs, and the server logs
``The server is fired up and ready to roll!``. Environment: see :mod:`specab.sim.settings`.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import importlib
import json
import os
import signal
import socket
import sys
import time
from typing import Any, Optional

from specab.sim import versions
from specab.sim.args import ServerArgs, SpecRuleError, apply_rules, parse_server_args
from specab.sim.gpustate import GpuNode
from specab.sim.loadplan import capacity, scheduler_plan
from specab.sim.profile import Profile, ProfileError, load_profile
from specab.sim.settings import SettingsError, SimSettings
from specab.sim.simlog import SimLogger, sglang_prefix
from specab.sim.timing import TimingModel, nccl_factor

SGLANG_LAUNCH_FILE = "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py"


def timing_env(profile: Profile, reports: dict[int, dict[str, Any]], world: int) -> dict[str, str]:
    """The environment that decides the timing: the scheduler whose NCCL setting is slowest (of the ready reports of
    the local schedulers, by rank); the simulated acceptance length is the first one's."""
    envs = [r.get("env", {}) for _, r in sorted(reports.items())]
    if not envs:
        return {}
    slowest = max(envs, key=lambda e: nccl_factor(profile, e, world))
    env = dict(slowest)
    acc = envs[0].get("SGLANG_SIMULATE_ACC_LEN")
    env.pop("SGLANG_SIMULATE_ACC_LEN", None)
    if acc is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = acc
    return env


class Launch:
    """One simulated SGLang launch: its worker processes (detokenizer, one scheduler per local rank), the HTTP
    server, the faults it was asked for and SGLang's way of dying."""

    def __init__(self, args: ServerArgs, settings: SimSettings, profile: Profile, log: SimLogger):
        self.args = args
        self.settings = settings
        self.profile = profile
        self.log = log
        self.node = GpuNode(settings.state)
        self.procs: list[asyncio.subprocess.Process] = []
        self.schedulers: dict[int, asyncio.subprocess.Process] = {}
        self.reports: dict[int, dict[str, Any]] = {}
        self.exit_event = asyncio.Event()
        self.crash_sent = False
        self.state: Any = None
        self._link_task: Optional[asyncio.Task] = None

    # ----- process tree
    def _local_ranks(self) -> list[int]:
        per_node = self.args.tp_size // self.args.nnodes
        return [self.args.node_rank * per_node + i for i in range(per_node)]

    def _gpu_of(self, local_index: int) -> int:
        logical = self.args.base_gpu_id + local_index * self.args.gpu_id_step
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd:
            ids = [c.strip() for c in cvd.split(",") if c.strip()]
            if logical < len(ids) and ids[logical].isdigit():
                return int(ids[logical])
        return logical

    def _release_lag(self) -> float:
        lag = self.settings.faults.slow_release
        lag = self.profile.gpu.release_lag_s if lag is None else lag
        return lag / self.settings.time_scale

    async def _spawn(self, cfg: dict[str, Any]) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "specab.sim.worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=None, env=dict(os.environ))
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(cfg) + "\n").encode())
        await proc.stdin.drain()
        self.procs.append(proc)
        return proc

    def kill_tree(self, include_parent: bool = True) -> None:
        """SGLang's kill_process_tree: SIGKILL every child, then this process."""
        if not self.settings.faults.orphan_workers:
            for p in self.procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        if include_parent:
            sys.stderr.flush()
            if self.settings.faults.orphan_workers:
                os._exit(0)
            os.kill(os.getpid(), signal.SIGKILL)

    def _on_sigquit(self) -> None:
        self.log.error("Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree()

    # ----- launch
    async def launch_subprocesses(self) -> bool:
        a, st = self.args, self.settings
        world = a.tp_size * a.pp_size
        if a.dist_init_addr and a.nnodes > 1:   # the node link listens on the port; torch (GPU mode) on port+1
            host, _, port = a.dist_init_addr.rpartition(":")
            dist_init = f"{host}:{int(port) + 1}"
        else:
            dist_init = a.dist_init_addr or f"127.0.0.1:{free_port()}"
        detok = None
        if a.node_rank == 0:
            detok = await self._spawn({"role": "detokenizer", "parent_pid": os.getpid(),
                                       "orphan": st.faults.orphan_workers, "log_prefix": "",
                                       "ignore_sigterm": st.faults.ignore_sigterm})
        for i, rank in enumerate(self._local_ranks()):
            gpu = self._gpu_of(i)
            plan = scheduler_plan(self.profile, a, rank, st.faults.oom_at_start and rank == 0, st.time_scale)
            cfg = {"role": "scheduler", "tp_rank": rank, "world_size": world, "gpu": gpu, "cuda_dev": i,
                   "parent_pid": os.getpid(), "orphan": st.faults.orphan_workers,
                   "log_prefix": sglang_prefix(rank, a.tp_size), "state": str(st.state), "plan": plan,
                   "release_lag_s": self._release_lag(), "gpu_mode": st.gpu_mode, "dist_init": dist_init,
                   "app_exit_lag_s": self.profile.gpu.app_exit_lag_s / st.time_scale,
                   "log_level": a.log_level, "ignore_sigterm": st.faults.ignore_sigterm}
            self.schedulers[rank] = await self._spawn(cfg)
        # the HTTP stack loads while the workers start (they never import it)
        importlib.import_module("specab.sim.httpapi")
        waits = [self._await_ready(rank, p) for rank, p in self.schedulers.items()]
        if detok is not None:
            waits.append(self._await_ready(-1, detok))
        results = await asyncio.gather(*waits)
        return all(results)

    async def _await_ready(self, rank: int, proc: asyncio.subprocess.Process) -> bool:
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        if not line:
            await asyncio.sleep(0.05)  # let a SIGQUIT from the failed child arrive first, as in SGLang
            code = await proc.wait()
            who = f"Rank {rank} scheduler" if rank >= 0 else "Detokenizer"
            self.log.error(f"{who} is dead. Please check if there are relevant logs.")
            self.log.error(f"Exit code: {code}")
            return False
        if rank >= 0:
            self.reports[rank] = json.loads(line)
        return True

    def fail_scheduler(self, error: str) -> None:
        """Make the first local scheduler fail with ``error`` (it SIGQUITs this process, as in SGLang)."""
        proc = self.schedulers.get(min(self.schedulers)) if self.schedulers else None
        if proc is None or proc.stdin is None or proc.returncode is not None:
            self.kill_tree()
            return
        proc.stdin.write((json.dumps({"cmd": "fail", "error": error}) + "\n").encode())

    def on_request_finished(self, n: int) -> None:
        limit = self.settings.faults.crash_after
        if limit is None or self.crash_sent or n < limit:
            return
        self.crash_sent = True
        proc = self.schedulers.get(min(self.schedulers)) if self.schedulers else None
        if proc is not None and proc.stdin is not None:
            asyncio.get_running_loop().call_later(0.02, lambda: proc.stdin.write(b"crash\n"))

    # ----- HTTP
    def bind(self) -> Optional[socket.socket]:
        a = self.args
        err: Optional[OSError] = None
        sock = socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.settings.faults.port_in_use:
            err = OSError(errno.EADDRINUSE, "address already in use")
        else:
            try:
                sock.bind((a.host, a.port))
            except OSError as exc:
                err = exc
        if err is not None:
            sock.close()
            strerror = (err.strerror or str(err)).lower()
            self.log.raw(f"ERROR:    [Errno {err.errno}] error while attempting to bind on address "
                         f"('{a.host}', {a.port}): {strerror}")
            return None
        return sock

    def _sim_info(self, timing: TimingModel, engine: Any, instance: int, epoch: float) -> dict[str, Any]:
        """/server_info's simulator entry: the profile, scale, seed, this start's instance and its true speed, and the
        faults that shape it."""
        st, slow = self.settings, self.settings.faults.slow_instance
        info = {"profile": self.profile.name, "time_scale": st.time_scale, "seed": st.seed,
                "instance": instance, "state": str(st.state), "nccl_factor": timing.nccl,
                "true_decode_tok_s": round(timing.true_decode_tok_s((time.time() - epoch) * st.time_scale)
                                           * st.time_scale / engine.slowdown(), 3)}
        if st.faults.throttle is not None:
            info["throttle"] = st.faults.throttle.to_dict()
        if slow is not None:
            info["slow_instance"] = {"instance": slow.instance, "last": slow.last, "pct": slow.pct,
                                     "this_instance": slow.is_slow(instance)}
        return info

    async def run(self) -> int:
        a, st = self.args, self.settings
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGQUIT, self._on_sigquit)
        started_at = time.time()
        instance = self.node.next_instance()
        epoch = float(self.node.ensure()["created_at"])
        if not await self.launch_subprocesses():
            self.kill_tree(include_parent=False)
            return 1
        if a.nnodes > 1:
            from specab.sim.multinode import PEER_LOST, NodeLink
            link = NodeLink(a.dist_init_addr or "", a.nnodes, a.node_rank,
                            SimLogger(sglang_prefix(self._local_ranks()[0], a.tp_size), level=a.log_level))
            await link.connect()

            def peer_lost(rank: int) -> None:
                self.log.error(f"Lost the connection to node {rank} (dist-init {a.dist_init_addr}).")
                self.fail_scheduler(PEER_LOST)
            self._link_task = asyncio.create_task(link.watch(peer_lost))
        if a.node_rank >= 1:
            return await self._dummy_health()
        from aiohttp import web
        from specab.sim.engine import Engine
        from specab.sim.httpapi import Api
        from specab.sim.replies import ServerState
        env = timing_env(self.profile, self.reports, self.args.tp_size * self.args.pp_size)
        timing = TimingModel.create(self.profile, a, env, st.seed, instance)
        slow = st.faults.slow_instance
        if slow is not None and slow.speed_factor(instance) != 1.0:
            timing = dataclasses.replace(timing, offset=timing.offset * slow.speed_factor(instance))
            self.log.info(f"specab.sim: slow_instance fault: instance {instance} decodes {slow.pct:g}% slower")
        cap = capacity(self.profile, a)
        gpus = [self._gpu_of(i) for i in range(len(self._local_ranks()))]
        engine = Engine(timing, cap, SimLogger(sglang_prefix(0, a.tp_size), level=a.log_level), st.time_scale,
                        epoch, st.seed,
                        a.decode_log_interval, radix_cache=not a.disable_radix_cache,
                        on_activity=lambda: self._report_activity(engine, gpus),
                        on_request_finished=self.on_request_finished, trace_path=st.trace,
                        throttle=st.faults.throttle, started_at=started_at,
                        departure=st.faults.departure(forced=timing.simulate_acc_len is not None,
                                                      deterministic=a.enable_deterministic_inference))
        self.state = ServerState(args=a, cap=cap, engine=engine, log=self.log, version=versions.current().name,
                                 architecture=self.profile.model.architecture,
                                 simulator=self._sim_info(timing, engine, instance, epoch),
                                 buffered_stream=st.faults.buffered_stream,
                                 on_flush=lambda ok: self.node.record_flush(instance, ok))
        await asyncio.sleep(self.profile.load.http_start_s / st.time_scale)
        sock = self.bind()
        if sock is None:
            self.kill_tree(include_parent=False)
            return 1
        engine_task = asyncio.create_task(engine.run())
        runner = web.AppRunner(Api(self.state).app(), access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        pid = os.getpid()
        self.log.raw(f"INFO:     Started server process [{pid}]")
        self.log.raw("INFO:     Waiting for application startup.")
        self.log.raw("INFO:     Application startup complete.")
        self.log.raw(f"INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)")
        self._install_sigterm(loop)
        if not a.skip_server_warmup:
            req = engine.submit(["The", "capital", "city", "of", "France", "is"], 8, False, internal=True)
            while not (await req.queue.get()).finished:
                pass
            self.log.raw(f'INFO:     127.0.0.1:{free_port()} - "POST /generate HTTP/1.1" 200 OK')
        self.state.status = "ready"
        self.log.info("The server is fired up and ready to roll!")
        await self.exit_event.wait()
        await self._graceful_exit()
        engine_task.cancel()
        return 0

    def _report_activity(self, engine: Any, gpus: list[int]) -> None:
        """Tell the node's smi that these GPUs compute (busy look), at a lowered clock while throttled."""
        t = engine.throttled()
        if t is None:
            self.node.set_activity(gpus, 1.0)
        else:
            self.node.set_activity(gpus, 1.0, clock_ratio=t.clock_ratio, reasons=t.reasons)

    def _install_sigterm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.settings.faults.ignore_sigterm:
            loop.add_signal_handler(signal.SIGTERM, lambda: self.log.warning(
                "Received SIGTERM; ignored (SPECAB_SIM_FAULT=ignore_sigterm)."))
        else:
            loop.add_signal_handler(signal.SIGTERM, self._begin_exit)
        loop.add_signal_handler(signal.SIGINT, self._begin_exit)

    def _begin_exit(self) -> None:
        if self.state is not None:
            self.state.status = "exiting"
        self.exit_event.set()

    async def _graceful_exit(self) -> None:
        """SGLang's sigterm_watchdog: notice within a poll, drain in-flight requests, kill the tree."""
        poll = self.profile.load.sigterm_poll_s / self.settings.time_scale
        if not os.environ.get("SGL_FORCE_SHUTDOWN"):
            await asyncio.sleep(poll * 0.5)
            st = self.state
            while st is not None and (st.engine.busy() or st.inflight):
                remaining = max(st.inflight, len(st.engine.running) + len(st.engine.waiting))
                self.log.info(f"Gracefully exiting... Remaining number of requests {remaining}")
                await asyncio.sleep(poll)
        if versions.current().shutdown_req:
            # 0.5.23 (tokenizer_manager.py:3508-3570): ShutdownReq to the schedulers, wait up to 15 s, kill the
            # children only, stop uvicorn; the main process exits normally (0)
            self.log.info("Sending ShutdownReq to the schedulers and waiting for them to exit.")
            self.kill_tree(include_parent=False)
            self.log.raw("INFO:     Shutting down")
            self.log.raw("INFO:     Application shutdown complete.")
            return
        self.kill_tree()

    async def _dummy_health(self) -> int:
        from aiohttp import web
        sock = self.bind()
        if sock is None:
            self.kill_tree(include_parent=False)
            return 1
        app = web.Application()

        async def ok(_: web.Request) -> web.Response:
            return web.Response(status=200)
        app.router.add_get("/health", ok)
        app.router.add_get("/health_generate", ok)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        loop = asyncio.get_running_loop()
        self._install_sigterm(loop)
        await self.exit_event.wait()
        self.kill_tree()
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _print_rule_error(exc: BaseException) -> None:
    sys.stderr.write("Traceback (most recent call last):\n"
                     f'  File "{SGLANG_LAUNCH_FILE}", line 11, in <module>\n'
                     "    server_args = prepare_server_args(sys.argv[1:])\n"
                     f"AssertionError: {exc}\n")
    sys.stderr.flush()


def apply_sglang_env(args: ServerArgs, version: str = versions.DEFAULT) -> None:
    """Environment SGLang's _set_envs_and_config sets before spawning the schedulers (engine.py:1878-1921;
    0.5.9 engine.py:807-819): CUDA_DEVICE_MAX_CONNECTIONS=8 in both, CUDA_MODULE_LOADING=AUTO in 0.5.9 only."""
    os.environ.setdefault("NCCL_CUMEM_ENABLE", str(int(args.enable_symm_mem)))
    if not args.enable_symm_mem:
        os.environ.setdefault("NCCL_NVLS_ENABLE", str(int(args.enable_nccl_nvls)))
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    if versions.VERSIONS[version].cuda_module_loading:
        os.environ["CUDA_MODULE_LOADING"] = "AUTO"


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        version = versions.current()
    except versions.VersionError as exc:
        sys.stderr.write(f"specab.sim: {exc}\n")
        return 1
    # exits 2 with "unrecognized arguments" (0.5.23 also "ambiguous option"), as SGLang does
    args = parse_server_args(argv, version=version.name)
    log = SimLogger("")
    try:
        settings = SimSettings.from_env()
        profile = load_profile(settings.profile_ref)
    except (SettingsError, ProfileError) as exc:
        sys.stderr.write(f"specab.sim: {exc}\n")
        return 1
    try:
        args, warnings = apply_rules(args, profile.model.architecture, version=version.name)
    except SpecRuleError as exc:
        _print_rule_error(exc)
        return 1
    log = SimLogger("", level=args.log_level)
    if version.graph_flags_per_phase and "--disable-cuda-graph" in argv:
        log.warning("--disable-cuda-graph is deprecated; use --cuda-graph-backend-decode=disabled "
                    "--cuda-graph-backend-prefill=disabled instead.")
    for w in warnings:
        log.warning(w)
    if settings.faults.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # the main process (HTTP server + tokenizer manager) is untitled in SGLang, both versions (A7)
    log.info(f"server_args={args!r}")
    apply_sglang_env(args, version.name)
    try:
        return asyncio.run(Launch(args, settings, profile, log).run())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
