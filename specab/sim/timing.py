"""The simulator's timing model: pure functions of (profile, server args, worker env, seed, instance, time).

Everything here is in *simulated* seconds (time scale 1); the running server divides by
SPECAB_SIM_TIME_SCALE. Nothing here starts processes or sleeps, so statistics code can compute the
true speed of an arm (``true_decode_tok_s``) and draw many seeded replicates in-process.

Model (docs/simulator.md "Timing model"):
- decode forward (baseline) at batch size ``bs``:
  ``step_ms * (1 + bs_slope*(bs-1)) * graph * nccl / speed``, ``graph`` = ``no_graph_factor`` when the step
  cannot use a CUDA graph (``--disable-cuda-graph`` or ``bs > cuda_graph_max_bs``), else 1.
- speculative cycle: ``(steps * draft_step_ms * graph + verify_ms * vgraph + overhead_ms) * (1 + spec.bs_slope*(bs-1)
  + spec.bs_log2_slope*log2(bs)) * nccl / speed`` with ``verify_ms = verify_base_ms + verify_per_token_ms * num_draft_tokens``; ``vgraph`` =
  ``verify_graph_factor`` only when the profile's verify runs with a CUDA graph. ``draft_extend_ms`` is the
  GPU part of ``overhead_ms`` (``nominal_spec_phases_ms`` splits a cycle into the device-timer categories).
- tokens per verify step = 1 (bonus) + accepted drafts, accepted drafts drawn from the per-position
  conditional acceptance (topk > 1 widens each position to ``1-(1-a)^topk``), or from
  ``SGLANG_SIMULATE_ACC_LEN`` (normal around it, sd 1, rounded, clamped to [1, steps+1]).
- nccl = 1 when TP = 1, else ``1 + (untuned_factor-1) * share of the tuned NCCL_* variables that the
  scheduler's environment lacks or has with another value``.
- speed = instance offset (normal, ``instance_cv``, seeded by seed and instance) * drift
  (``drift_pct_per_hour`` per simulated hour since the node epoch, capped at ``drift_max_pct``);
  each request also gets a factor (``request_cv``) and each forward a jitter (``step_cv``, clipped at 3 sd).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from specab.sim.args import ServerArgs, apply_rules, server_args_from_mapping
from specab.sim.profile import Profile

SIMULATE_ACC_LEN_VAR = "SGLANG_SIMULATE_ACC_LEN"


def _as_args(args: ServerArgs | Mapping[str, Any], profile: Profile) -> ServerArgs:
    if isinstance(args, ServerArgs):
        return args
    values = dict(args)
    values.setdefault("model_path", "model")
    resolved, _ = apply_rules(server_args_from_mapping(values), profile.model.architecture)
    return resolved


def nccl_factor(profile: Profile, env: Mapping[str, str], world_size: int) -> float:
    """Slow-down of every forward from the NCCL variables the scheduler process has."""
    if world_size <= 1 or not profile.nccl.tuned:
        return 1.0
    missing = sum(1 for k, v in profile.nccl.tuned.items() if env.get(k) != v)
    return 1.0 + (profile.nccl.untuned_factor - 1.0) * missing / len(profile.nccl.tuned)


def drift_factor(profile: Profile, t_sim_s: float) -> float:
    """Speed multiplier from the slow drift, ``t_sim_s`` simulated seconds after the node epoch:
    ``1 + drift_pct_per_hour/100 * hours``, the change capped at ``drift_max_pct``."""
    n = profile.noise
    pct = n.drift_pct_per_hour * max(0.0, t_sim_s) / 3600.0
    pct = max(-n.drift_max_pct, min(n.drift_max_pct, pct))
    return 1.0 + pct / 100.0


def instance_factor(profile: Profile, seed: int, instance: int) -> float:
    cv = profile.noise.instance_cv
    if cv <= 0:
        return 1.0
    rng = random.Random(f"instance:{seed}:{instance}")
    return max(0.5, 1.0 + _clipped_gauss(rng, cv))


def _clipped_gauss(rng: random.Random, sd: float) -> float:
    if sd <= 0:
        return 0.0
    return max(-3 * sd, min(3 * sd, rng.gauss(0.0, sd)))


def request_rng(seed: int, instance: int, n: int) -> random.Random:
    """The RNG of the n-th user request (1-based) of a server instance; the running server uses it too."""
    return random.Random(f"req:{seed}:{instance}:{n}")


@dataclass(frozen=True)
class SimulatedRequest:
    """What a client would measure for one single-stream request (simulated seconds)."""
    output_tokens: int
    decode_s: float          # time from the first token to the last token
    verify_ct: int           # verify steps (0 without speculation)
    decode_tok_s: float      # (output_tokens - 1) / decode_s
    accept_len: Optional[float]  # output_tokens / verify_ct, as SGLang's spec_accept_length


@dataclass(frozen=True)
class CyclePhases:
    """Nominal ms of one speculative cycle per phase; ``other_ms`` is CPU time outside the forward passes."""
    draft_ms: float
    draft_extend_ms: float
    verify_ms: float
    other_ms: float

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.draft_extend_ms + self.verify_ms + self.other_ms

    def shares(self) -> dict[str, float]:
        """Share of the cycle per device-timer category (and ``other``), summing to 1."""
        t = self.total_ms
        return {"eagle_draft": self.draft_ms / t, "eagle_draft_extend": self.draft_extend_ms / t,
                "target_verify": self.verify_ms / t, "other": self.other_ms / t}


@dataclass
class TimingModel:
    """Timing of one server instance. Build with :meth:`create`."""
    profile: Profile
    args: ServerArgs
    env: Mapping[str, str]
    seed: int
    instance: int
    nccl: float
    offset: float
    simulate_acc_len: Optional[float]

    @classmethod
    def create(cls, profile: Profile, args: ServerArgs | Mapping[str, Any], env: Mapping[str, str],
               seed: int = 0, instance: int = 0) -> "TimingModel":
        sargs = _as_args(args, profile)
        acc = env.get(SIMULATE_ACC_LEN_VAR)
        sim_acc: Optional[float] = None
        if acc not in (None, ""):
            try:
                value = float(acc)
            except ValueError as exc:
                raise ValueError(f"{SIMULATE_ACC_LEN_VAR}={acc!r} is not a number") from exc
            sim_acc = value if value > 0 else None
        return cls(profile=profile, args=sargs, env=dict(env), seed=seed, instance=instance,
                   nccl=nccl_factor(profile, env, sargs.tp_size * sargs.pp_size),
                   offset=instance_factor(profile, seed, instance), simulate_acc_len=sim_acc)

    # ----- configuration-derived facts
    @property
    def speculative(self) -> bool:
        return self.args.speculative_algorithm is not None and self.args.speculative_num_steps is not None

    @property
    def steps(self) -> int:
        return int(self.args.speculative_num_steps or 0)

    @property
    def topk(self) -> int:
        return int(self.args.speculative_eagle_topk or 1)

    @property
    def draft_tokens(self) -> int:
        return int(self.args.speculative_num_draft_tokens or 0)

    @property
    def cuda_graph_max_bs(self) -> int:
        if self.args.cuda_graph_bs:
            return max(self.args.cuda_graph_bs)
        if self.args.cuda_graph_max_bs is not None:
            return self.args.cuda_graph_max_bs
        limit = self.profile.decode.default_cuda_graph_max_bs
        if self.args.max_running_requests is not None:
            limit = min(limit, self.args.max_running_requests)
        return limit

    def graph_used(self, bs: int) -> bool:
        """Whether the decode forward (baseline) or the verify forward (spec) runs with a CUDA graph."""
        if self.args.disable_cuda_graph or bs > self.cuda_graph_max_bs:
            return False
        if self.speculative:
            return self.profile.spec.verify_cuda_graph
        return True

    def speed(self, t_sim_s: float) -> float:
        return self.offset * drift_factor(self.profile, t_sim_s)

    def request_factor(self, rng: random.Random) -> float:
        return max(0.5, 1.0 + _clipped_gauss(rng, self.profile.noise.request_cv))

    def _jitter(self, rng: Optional[random.Random]) -> float:
        if rng is None:
            return 1.0
        return max(0.1, 1.0 + _clipped_gauss(rng, self.profile.noise.step_cv))

    # ----- forward times (simulated seconds)
    def nominal_decode_step_s(self, bs: int = 1) -> float:
        d = self.profile.decode
        graph = 1.0 if self.graph_used(bs) else d.no_graph_factor
        return d.step_ms * (1.0 + d.bs_slope * (max(1, bs) - 1)) * graph * self.nccl / 1000.0

    def spec_batch_factor(self, bs: int = 1) -> float:
        """How much longer a speculative cycle of ``bs`` running requests takes than one of a single request:
        ``1 + bs_slope*(bs-1) + bs_log2_slope*log2(bs)`` (every phase alike)."""
        s = self.profile.spec
        n = max(1, bs)
        return 1.0 + s.bs_slope * (n - 1) + s.bs_log2_slope * math.log2(n)

    def nominal_spec_phases_ms(self, bs: int = 1) -> "CyclePhases":
        """One speculative cycle split into its phases (nominal ms, no jitter or speed): what SGLang 0.5.23's
        device timer reports per category (eagle_draft, eagle_draft_extend, target_verify) and the CPU rest."""
        s = self.profile.spec
        draft_graph = 1.0 if not (self.args.disable_cuda_graph or bs > self.cuda_graph_max_bs) \
            else self.profile.decode.no_graph_factor
        verify = s.verify_base_ms + s.verify_per_token_ms * self.draft_tokens
        if self.graph_used(bs):
            verify *= s.verify_graph_factor
        extend = min(s.draft_extend_ms, s.overhead_ms)
        k = self.spec_batch_factor(bs) * self.nccl
        passes = max(0, self.steps - s.draft_passes_offset)
        return CyclePhases(draft_ms=passes * s.draft_step_ms * draft_graph * k, draft_extend_ms=extend * k,
                           verify_ms=verify * k, other_ms=(s.overhead_ms - extend) * k)

    def nominal_spec_cycle_s(self, bs: int = 1) -> float:
        return self.nominal_spec_phases_ms(bs).total_ms / 1000.0

    def step_s(self, bs: int, t_sim_s: float, rng: Optional[random.Random] = None,
               request_speed: float = 1.0) -> float:
        """One decode step (baseline) or one draft+verify cycle (spec) for ``bs`` running requests."""
        nominal = self.nominal_spec_cycle_s(bs) if self.speculative else self.nominal_decode_step_s(bs)
        return nominal * self._jitter(rng) / (self.speed(t_sim_s) * request_speed)

    def prefill_s(self, new_tokens: int, t_sim_s: float, rng: Optional[random.Random] = None) -> float:
        p = self.profile.prefill
        ms = (p.base_ms + p.per_token_ms * max(0, new_tokens)) * self.nccl
        return ms / 1000.0 * self._jitter(rng) / self.speed(t_sim_s)

    # ----- acceptance
    def position_acceptance(self) -> list[float]:
        """Conditional acceptance probability of draft positions 1..max accepted."""
        base = self.profile.spec.acceptance
        n = min(self.steps, max(0, self.draft_tokens - 1))
        return [1.0 - (1.0 - base[min(i, len(base) - 1)]) ** self.topk for i in range(n)]

    def expected_accept_length(self) -> float:
        """Expected tokens per verify step including the bonus token (1.0 without speculation)."""
        if not self.speculative:
            return 1.0
        if self.simulate_acc_len is not None:
            return _expected_simulated(self.simulate_acc_len, self.steps + 1)
        total, run = 1.0, 1.0
        for a in self.position_acceptance():
            run *= a
            total += run
        return total

    def tokens_per_verify(self, rng: random.Random) -> int:
        """Draw the tokens one verify step emits for one request (bonus token included)."""
        if self.simulate_acc_len is not None:
            value = round(rng.gauss(self.simulate_acc_len, 1.0))
            return int(max(1, min(self.steps + 1, value)))
        tokens = 1
        for a in self.position_acceptance():
            if rng.random() >= a:
                break
            tokens += 1
        return tokens

    # ----- a whole request, without a server
    def simulate_request(self, output_len: int, t_sim_s: float = 0.0,
                         rng: Optional[random.Random] = None) -> SimulatedRequest:
        """Draw one single-stream request exactly as the server's scheduler loop does (same draw order:
        request factor, then per step the jitter and the acceptance), so coverage studies can run
        thousands of replicates in-process. ``rng`` defaults to :func:`request_rng` (seed, instance, 1)."""
        rng = rng or request_rng(self.seed, self.instance, 1)
        speed = self.request_factor(rng)
        produced, elapsed, verify = (1 if output_len > 0 else 0), 0.0, 0
        while produced < output_len:
            dt = self.step_s(1, t_sim_s + elapsed, rng, request_speed=speed)
            elapsed += dt
            if self.speculative:
                produced += min(self.tokens_per_verify(rng), output_len - produced)
                verify += 1
            else:
                produced += 1
        rate = (produced - 1) / elapsed if elapsed > 0 else float("nan")
        return SimulatedRequest(produced, elapsed, verify, rate,
                                produced / verify if verify else None)

    # ----- truth
    def true_decode_tok_s(self, t_sim_s: float = 0.0, bs: int = 1) -> float:
        """Expected single-request decode speed (tokens/s) at simulated time ``t_sim_s``, no jitter."""
        if self.speculative:
            return self.expected_accept_length() / self.nominal_spec_cycle_s(bs) * self.speed(t_sim_s)
        return 1.0 / self.nominal_decode_step_s(bs) * self.speed(t_sim_s)


def _expected_simulated(mean: float, upper: int) -> float:
    """E[clamp(round(N(mean, 1)), 1, upper)] computed exactly over the integers."""
    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf((x - mean) / math.sqrt(2.0)))
    total = 0.0
    for k in range(1, upper + 1):
        lo = -math.inf if k == 1 else k - 0.5
        hi = math.inf if k == upper else k + 0.5
        p = (cdf(hi) if hi != math.inf else 1.0) - (cdf(lo) if lo != -math.inf else 0.0)
        total += k * p
    return total


def true_decode_tok_s(profile: Profile, args: ServerArgs | Mapping[str, Any], env: Mapping[str, str],
                      t_sim_s: float = 0.0, seed: int = 0, instance: int = 0, bs: int = 1) -> float:
    """The true single-stream decode speed of an arm: what an ideal client would measure."""
    return TimingModel.create(profile, args, env, seed, instance).true_decode_tok_s(t_sim_s, bs)
