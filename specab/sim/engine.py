"""The simulated scheduler loop: continuous batching, prefill/decode steps, speculative verify steps.

Runs in the main process's event loop. Step durations come from :mod:`specab.sim.timing`, divided
by the time scale, on an absolute schedule (each step is due ``dt`` after the previous one was due, and
ends then or, on a loaded box, later), so timer granularity does not bias the measured speed. Writes
SGLang's ``Prefill batch, ...`` and ``Decode batch, ...`` lines (0.5.9 format) every batch / every
``--decode-log-interval`` steps.
"""
from __future__ import annotations

import asyncio
import random
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from specab.sim.loadplan import Capacity
from specab.sim.outputs import Departure, Output, prompt_digest
from specab.sim.sampling import Sampling
from specab.sim.profiler import Profiler
from specab.sim import versions
from specab.sim.simlog import SimLogger
from specab.sim.throttle import Throttle
from specab.sim.timing import TimingModel, request_rng

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
EOS_TOKEN_ID = 163586
VOCAB = ("the model answers every question with a short and careful explanation of how speculative "
         "decoding drafts several tokens then verifies them in one forward pass so the accepted ones "
         "arrive together and the rest are drawn again while the GPU waits for the next batch of "
         "requests to arrive from clients across the network").split()


def count_prompt_tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


@dataclass
class Emission:
    count: int          # total output tokens after this emission
    finished: bool


@dataclass
class GenRequest:
    rid: str
    prompt: tuple[str, ...]
    prompt_tokens: int
    max_new_tokens: int
    stop_at: int
    rng: random.Random
    speed: float
    output: Optional[Output] = None     # the output token ids (specab/sim/outputs.py), apart from timing
    created: float = field(default_factory=time.time)
    queue: "asyncio.Queue[Emission]" = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    verify_ct: int = 0
    # per verify cycle the draft's correct proposals (the draw, before the request's length cut it), counted by
    # how many: SGLang's per-request spec_correct_drafts_histogram (entry j = cycles with j correct, j = 0..steps)
    accept_hist: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    finished_reason: Optional[dict] = None
    finished_at: Optional[float] = None
    aborted: bool = False
    internal: bool = False          # warm-up and health-check requests (not counted by crash_after)
    arrival_mono: float = field(default_factory=time.monotonic)
    emit_mono: list[float] = field(default_factory=list)   # ground truth: when each chunk was emitted
    # when the schedule said each chunk was due (emit_mono[i] >= emit_due[i]): the steps are paced on absolute
    # deadlines, so a late emission is followed by shorter waits until the schedule is met again
    emit_due: list[float] = field(default_factory=list)
    emit_tokens: list[int] = field(default_factory=list)
    text_cache: str = field(default="", repr=False)       # text of the first text_cache_n tokens
    text_cache_n: int = field(default=0, repr=False)
    # ground truth: device-timer seconds (wall) per category of the decode passes that served this request (each
    # pass counted whole: the batch shares it) and the batch sizes of those passes, summed
    pass_forward_s: dict[str, float] = field(default_factory=dict)
    pass_batch_sum: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    def text(self, count: Optional[int] = None) -> str:
        """Detokenized text of the first ``count`` output tokens (cached: streaming asks in order)."""
        count = len(self.output_ids) if count is None else count
        if count < self.text_cache_n:
            return "".join(" " + VOCAB[i % len(VOCAB)] for i in self.output_ids[:count])
        if count > self.text_cache_n:
            self.text_cache += "".join(" " + VOCAB[i % len(VOCAB)]
                                       for i in self.output_ids[self.text_cache_n:count])
            self.text_cache_n = count
        return self.text_cache

    def _emit(self, n: int, due: float) -> Emission:
        assert self.output is not None
        for _ in range(n):
            self.output_ids.append(self.output.next_id())
        self.emit_mono.append(time.monotonic())
        self.emit_due.append(due)
        self.emit_tokens.append(n)
        done = len(self.output_ids) >= self.stop_at
        if done:
            self.finished_at = time.time()
            if self.stop_at >= self.max_new_tokens:
                self.finished_reason = {"type": "length", "length": self.max_new_tokens}
            else:
                self.finished_reason = {"type": "stop", "matched": EOS_TOKEN_ID}
        em = Emission(len(self.output_ids), done)
        self.queue.put_nowait(em)
        return em


def _sample_truth(output: Optional[Output]) -> Optional[dict]:
    """A sampled request's truth for the trace (sampling.py): tokens off the target's law, the sum of the target's
    log-probabilities of its output, whether a drawn end of sequence ended it; None for a greedy request."""
    if output is None or output.sample is None:
        return None
    s = output.sample
    return {"off_law": s.off_law, "target_logprob": s.target_logprob, "tokens": len(s.ids), "stopped": s.stopped}


@dataclass
class EngineStats:
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_requests_total: int = 0
    spec_verify_calls_total: int = 0
    cum_accept_tokens: int = 0     # since start or /flush_cache
    cum_accept_steps: int = 0
    last_gen_throughput: float = 0.0
    last_accept_length: float = 0.0
    last_token_usage: float = 0.0
    finished_requests: int = 0
    schedule_lag_max_s: float = 0.0   # how far (wall s) steps ended after their scheduled time
    schedule_resets: int = 0          # times the schedule was restarted after falling > 0.5 s behind
    # SGLang 0.5.23 device timer: wall seconds of forward passes per category (extend, decode, eagle_draft,
    # eagle_draft_extend, target_verify) and forward passes per CUDA-graph mode (engines-2026.md A5)
    forward_s: dict[str, float] = field(default_factory=dict)
    graph_passes: dict[str, int] = field(default_factory=dict)

    def add_forward(self, category: str, seconds: float) -> None:
        self.forward_s[category] = self.forward_s.get(category, 0.0) + seconds

    def add_pass(self, mode: str) -> None:
        self.graph_passes[mode] = self.graph_passes.get(mode, 0) + 1


def trace_record(req: GenRequest, time_scale: float) -> dict[str, Any]:
    """The trace's line of a finished request (SPECAB_SIM_TRACE): its emission times and counts."""
    n = req.completion_tokens
    span = req.emit_mono[-1] - req.emit_mono[0] if len(req.emit_mono) > 1 else 0.0
    return {"rid": req.rid, "prompt_tokens": req.prompt_tokens, "completion_tokens": n,
            "arrival_mono": req.arrival_mono, "arrival_wall": req.created, "emit_mono": req.emit_mono,
            "emit_due": req.emit_due,
            "emit_tokens": req.emit_tokens, "spec_verify_ct": req.verify_ct,
            "diverged_at": req.output.diverged_at if req.output else None,
            "prompt_digest": prompt_digest(req.prompt), "sampled": _sample_truth(req.output),
            "accept_hist": req.accept_hist,
            "pass_forward_s": req.pass_forward_s, "pass_batch_sum": req.pass_batch_sum,
            "ttft_s": req.emit_mono[0] - req.arrival_mono if req.emit_mono else None,
            "decode_tok_s": (n - 1) / span if span > 0 else None, "time_scale": time_scale}


def prefill_line(batch: list[GenRequest], new_tokens: int, cached: int, usage: float, running_before: int,
                 waiting: deque[GenRequest], elapsed: float) -> str:
    """SGLang's "Prefill batch" log line of the simulated version."""
    if versions.current().name == "0.5.9":
        return (f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
                f"#cached-token: {cached}, token usage: {usage:.2f}, #running-req: {running_before}, "
                f"#queue-req: {len(waiting)}, input throughput (token/s): {new_tokens / elapsed:.2f}, ")
    # 0.5.23 metrics_reporter.py:754-779: #pending-token, then the graph field, no trailing comma
    return (f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
            f"#cached-token: {cached}, token usage: {usage:.2f}, #running-req: {running_before}, "
            f"#queue-req: {len(waiting)}, #pending-token: {sum(r.prompt_tokens for r in waiting)}, "
            f"cuda graph: False, input throughput (token/s): {new_tokens / elapsed:.2f}")


def longest_prefix(cache: Iterable[tuple[str, ...]], prompt: tuple[str, ...]) -> int:
    """The longest prefix of ``prompt`` that a cached prompt shares (the radix cache's hit, in tokens)."""
    best = 0
    for old in cache:
        n = 0
        for a, b in zip(old, prompt):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


class DecodeWindow:
    """The decode steps since the last "Decode batch" log line (one every decode_log_interval steps): the tokens
    they generated and, on a speculative server, the tokens accepted per verify (the line's accept len)."""

    def __init__(self, start: float) -> None:
        self.tokens = 0
        self.accept_tokens = 0
        self.accept_steps = 0
        self.start = start

    def accept_len(self) -> float:
        return self.accept_tokens / self.accept_steps if self.accept_steps else 0.0


class Engine:
    def __init__(self, timing: TimingModel, cap: Capacity, log: SimLogger, time_scale: float, epoch: float,
                 seed: int, decode_log_interval: int, radix_cache: bool = True,
                 on_activity: Optional[Callable[[], None]] = None,
                 on_request_finished: Optional[Callable[[int], None]] = None,
                 trace_path: Optional[str] = None, throttle: Optional[Throttle] = None,
                 started_at: Optional[float] = None, departure: Departure = Departure()):
        self.timing = timing
        self.throttle = throttle
        self.started_at = time.time() if started_at is None else started_at
        self.cap = cap
        self.log = log
        self.scale = time_scale
        self.epoch = epoch
        self.seed = seed
        self.interval = max(1, decode_log_interval)
        self.radix = radix_cache
        self.on_activity = on_activity
        self.on_request_finished = on_request_finished
        self.trace_path = trace_path
        # how this server's outputs depart from the target's: only a speculative server's do
        self.departure = departure if timing.speculative else Departure()
        self.waiting: deque[GenRequest] = deque()
        self.running: list[GenRequest] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self._n = 0
        self._user_n = 0
        self._cache: deque[tuple[str, ...]] = deque(maxlen=256)
        self._forward_ct_decode = 0
        self._win = DecodeWindow(time.monotonic())
        self._last_prefill = time.monotonic()
        self.profiler: Optional[Profiler] = None

    # ----- requests
    def submit(self, prompt: list[str] | tuple[str, ...], max_new_tokens: int, ignore_eos: bool,
               rid: Optional[str] = None, prompt_tokens: Optional[int] = None,
               internal: bool = False, sampled: Optional[Sampling] = None) -> GenRequest:
        self._n += 1
        if internal:
            rng = random.Random(f"internal:{self.seed}:{self.timing.instance}:{self._n}")
        else:  # user requests draw from their own sequence: health polls do not shift the draws
            self._user_n += 1
            rng = request_rng(self.seed, self.timing.instance, self._user_n)
        max_new = max(0, int(max_new_tokens))
        where = f"{self.seed}:{self.timing.instance}:{self._n}"
        output = Output(prompt, max_new, ignore_eos, self.departure, random.Random(f"departure:{where}"), where,
                        sampled)
        req = GenRequest(rid=rid or f"{self._n:032x}", prompt=tuple(prompt),
                         prompt_tokens=prompt_tokens if prompt_tokens is not None else len(prompt) + 1,
                         max_new_tokens=max_new, stop_at=output.stop_at, rng=rng,
                         speed=self.timing.request_factor(rng), internal=internal, output=output)
        self.waiting.append(req)
        self.stats.num_requests_total += 1
        self._wake.set()
        return req

    def abort(self, req: GenRequest) -> None:
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)

    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def flush_cache(self) -> bool:
        if self.busy():
            self.log.warning(f"Cache not flushed because there are pending requests. "
                             f"#queue-req: {len(self.waiting)}, #running-req: {len(self.running)}")
            return False
        self._cache.clear()
        self.stats.cum_accept_tokens = 0
        self.stats.cum_accept_steps = 0
        self.log.info("Cache flushed successfully!")
        return True

    @property
    def avg_spec_accept_length(self) -> float:
        s = self.stats
        return s.cum_accept_tokens / s.cum_accept_steps if s.cum_accept_steps else 0.0

    # ----- helpers
    def _t_sim(self) -> float:
        return (time.time() - self.epoch) * self.scale

    def _elapsed_sim(self) -> float:
        """Simulated seconds since the server process started (the throttle fault's clock)."""
        return (time.time() - self.started_at) * self.scale

    def throttled(self) -> Optional[Throttle]:
        """The throttle fault when it is in effect now (GPU clocks lowered), else None."""
        if self.throttle is not None and self.throttle.active(self._elapsed_sim()):
            return self.throttle
        return None

    def slowdown(self) -> float:
        return self.throttle.time_factor(self._elapsed_sim()) if self.throttle is not None else 1.0

    def _num_used(self) -> int:
        return sum(r.prompt_tokens + r.completion_tokens for r in self.running)

    def _cached_prefix(self, prompt: tuple[str, ...]) -> int:
        return longest_prefix(self._cache, prompt) if self.radix else 0

    async def _sleep_until(self, deadline: float) -> None:
        # the event loop may wake a timer up to its clock resolution early: wait until the deadline has passed
        while (delay := deadline - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        self.stats.schedule_lag_max_s = max(self.stats.schedule_lag_max_s, time.monotonic() - deadline)

    def _finish(self, req: GenRequest) -> None:
        if req.internal:
            return
        if self.trace_path:
            # after the HTTP handlers woken by this step's emissions have sent them: written here, the lines of
            # every request that ended in the step (32 at 32 in flight) held their last chunks back by ~15 ms
            asyncio.get_running_loop().call_soon(self._trace, req)
        self.stats.finished_requests += 1
        if self.on_request_finished:
            self.on_request_finished(self.stats.finished_requests)

    def _trace(self, req: GenRequest) -> None:
        """One JSON line per finished request: the emission times the client's measurement should match."""
        import json
        try:
            with open(self.trace_path, "a") as fh:
                fh.write(json.dumps(trace_record(req, self.scale)) + "\n")
        except OSError as exc:
            self.log.warning(f"specab.sim: cannot write SPECAB_SIM_TRACE={self.trace_path}: {exc}")
            self.trace_path = None

    # ----- the loop
    async def run(self) -> None:
        next_t = time.monotonic()
        last_activity = 0.0
        while True:
            if not self.busy():
                self._wake.clear()
                await self._wake.wait()
                next_t = time.monotonic()
            now = time.monotonic()
            if next_t < now - 0.5:          # fell far behind (process stalled): restart the schedule
                self.stats.schedule_resets += 1
                if self.stats.schedule_resets in (1, 10, 100, 1000):
                    self.log.warning(f"specab.sim: the simulated scheduler fell {now - next_t:.2f} s behind "
                                     f"real time (CPU starved?); measured speeds will read low. Lower "
                                     f"SPECAB_SIM_TIME_SCALE (now {self.scale:g}) or the machine's load.")
                next_t = now
            if self.on_activity and now - last_activity > 0.3:
                self.on_activity()
                last_activity = now
            if self.waiting and len(self.running) < self.cap.max_running_requests:
                next_t = await self._prefill(next_t)
            elif self.running:
                next_t = await self._decode(next_t)
            else:
                await asyncio.sleep(0.001)

    async def _prefill(self, next_t: float) -> float:
        room = self.cap.max_running_requests - len(self.running)
        batch = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        new_tokens = 0
        cached = 0
        for r in batch:
            r.cached_tokens = min(self._cached_prefix(r.prompt), max(0, r.prompt_tokens - 1))
            cached += r.cached_tokens
            new_tokens += r.prompt_tokens - r.cached_tokens
            self._cache.append(r.prompt)
        running_before = len(self.running)
        dt = self.timing.prefill_s(new_tokens, self._t_sim(), random.Random(f"prefill:{self.seed}:{self._n}"))
        wall = dt * self.slowdown() / self.scale
        next_t += wall
        await self._sleep_until(next_t)
        self.stats.add_forward("extend", wall)
        self.stats.add_pass("prefill_none")
        if self.profiler is not None:
            self.profiler.record_extend(len(batch), new_tokens, time.time() - wall, wall)
        elapsed = max(1e-9, time.monotonic() - self._last_prefill)
        self._last_prefill = time.monotonic()
        usage = (self._num_used() + sum(r.prompt_tokens for r in batch)) / max(1, self.cap.max_total_num_tokens)
        self.log.info(prefill_line(batch, new_tokens, cached, usage, running_before, self.waiting, elapsed))
        for r in batch:
            if r.aborted:
                continue
            self.stats.prompt_tokens_total += r.prompt_tokens
            if r.max_new_tokens == 0 or r.stop_at == 0:
                r.finished_at = time.time()
                r.finished_reason = {"type": "length", "length": 0}
                r.queue.put_nowait(Emission(0, True))
                self._finish(r)
                continue
            em = r._emit(1, next_t)
            self.stats.generation_tokens_total += 1
            if em.finished:
                self._finish(r)
            else:
                self.running.append(r)
        return next_t

    async def _decode(self, next_t: float) -> float:
        bs = len(self.running)
        speed = sum(r.speed for r in self.running) / bs
        rng = self.running[0].rng
        dt = self.timing.step_s(bs, self._t_sim(), rng, request_speed=speed)
        wall = dt * self.slowdown() / self.scale
        next_t += wall
        await self._sleep_until(next_t)
        graph = self.timing.graph_used(bs)
        spec = self.timing.speculative
        per_category = self._account_forward(bs, wall, graph)
        done: list[GenRequest] = []
        for r in list(self.running):
            if r.aborted:
                continue
            for cat, sec in per_category.items():
                r.pass_forward_s[cat] = r.pass_forward_s.get(cat, 0.0) + sec
            r.pass_batch_sum += bs
            remaining = r.stop_at - r.completion_tokens
            if spec:
                drawn = self.timing.tokens_per_verify(r.rng)
                n = min(drawn, remaining)
                if not r.accept_hist:
                    r.accept_hist = [0] * (self.timing.steps + 1)
                r.accept_hist[min(drawn - 1, self.timing.steps)] += 1
                r.verify_ct += 1
                self.stats.spec_verify_calls_total += 1
                self.stats.cum_accept_tokens += n
                self.stats.cum_accept_steps += 1
                self._win.accept_tokens += n
                self._win.accept_steps += 1
            else:
                n = 1
            em = r._emit(n, next_t)
            self.stats.generation_tokens_total += n
            self._win.tokens += n
            if em.finished:
                done.append(r)
        self._forward_ct_decode += 1
        if self._forward_ct_decode % self.interval == 0:
            self._log_decode(graph)
        for r in done:
            self.running.remove(r)
            self._finish(r)
        return next_t

    def _account_forward(self, bs: int, wall: float, graph: bool) -> dict[str, float]:
        """The device timer's view of one decode step or speculative cycle (wall seconds per category, returned)."""
        shares = None
        if self.timing.speculative:
            shares = self.timing.nominal_spec_phases_ms(bs).shares()
            out = {cat: wall * shares[cat] for cat in ("eagle_draft", "eagle_draft_extend", "target_verify")}
        else:
            out = {"decode": wall}
        for cat, sec in out.items():
            self.stats.add_forward(cat, sec)
        self.stats.add_pass("decode_cuda_graph" if graph else "decode_none")   # the target's forward
        if self.profiler is not None and self.profiler.record_decode(bs, time.time() - wall, wall, shares):
            self.finish_profile()
        return out

    def finish_profile(self) -> Optional[str]:
        """Write the profile in progress (if any); returns its path."""
        prof, self.profiler = self.profiler, None
        if prof is None:
            return None
        try:
            path = prof.write()
        except OSError as exc:
            self.log.warning(f"specab.sim: cannot write the profile {prof.path}: {exc}")
            return None
        self.log.info(f"specab.sim: profile of {prof.steps} steps written to {path}")
        return str(path)

    def _log_decode(self, graph: bool) -> None:
        now = time.monotonic()
        gap = max(1e-9, now - self._win.start)
        thr = self._win.tokens / gap
        num_used = self._num_used()
        usage = num_used / max(1, self.cap.max_total_num_tokens)
        msg = f"Decode batch, #running-req: {len(self.running)}, #token: {num_used}, token usage: {usage:.2f}, "
        if self.timing.speculative:
            acc = self._win.accept_len()
            k = max(1, self.timing.draft_tokens)
            # 0.5.9: accepted tokens incl. bonus / (verify * draft tokens); 0.5.23: correct drafts /
            # (verify * (draft tokens - 1)) (engines-2026.md A3)
            rate = acc / k if versions.current().name == "0.5.9" else max(0.0, acc - 1) / max(1, k - 1)
            msg += f"accept len: {acc:.2f}, accept rate: {rate:.2f}, "
            self.stats.last_accept_length = acc
        msg += f"cuda graph: {graph}, gen throughput (token/s): {thr:.2f}, #queue-req: {len(self.waiting)}"
        self.log.info(msg)
        self.stats.last_gen_throughput = thr
        self.stats.last_token_usage = usage
        self._win = DecodeWindow(now)
