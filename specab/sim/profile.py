"""Performance profiles of the simulated node: shipped YAML files or a user's YAML file.

A profile fixes every number the simulator uses (GPU inventory, load phases, forward times,
acceptance, NCCL effect, noise). ``load_profile("default")`` loads ``profiles/default.yml``;
any other value is read as a path. Unknown or missing keys are refused with the key's path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

PROFILE_DIR = Path(__file__).with_name("profiles")


class ProfileError(ValueError):
    """A profile file is missing, malformed, or has wrong keys."""


@dataclass(frozen=True)
class GpuLook:
    utilization: int
    temperature_c: int
    clocks_sm: int
    clocks_mem: int
    power_w: float


@dataclass(frozen=True)
class GpuProfile:
    count: int
    name: str
    memory_total_mib: int
    release_lag_s: float
    app_exit_lag_s: float   # a dead holder stays listed (as "[No data]") this long; <= release_lag_s
    idle: GpuLook
    busy: GpuLook
    clocks_max_sm: int
    power_limit_w: float


@dataclass(frozen=True)
class ModelProfile:
    architecture: str
    context_length: int
    weights_gib_per_gpu: float
    draft_weights_gib_per_gpu: float
    kv_tokens_per_gib: int
    cuda_graph_gib: float


@dataclass(frozen=True)
class LoadProfile:
    init_s: float
    weights_s: float
    draft_weights_s: float
    kv_cache_s: float
    cuda_graph_s: float
    draft_cuda_graph_s: float
    http_start_s: float
    sigterm_poll_s: float


@dataclass(frozen=True)
class DecodeProfile:
    step_ms: float
    no_graph_factor: float
    bs_slope: float
    default_cuda_graph_max_bs: int


@dataclass(frozen=True)
class PrefillProfile:
    base_ms: float
    per_token_ms: float


@dataclass(frozen=True)
class SpecProfile:
    draft_step_ms: float
    verify_base_ms: float
    verify_per_token_ms: float
    verify_cuda_graph: bool
    verify_graph_factor: float
    overhead_ms: float
    bs_slope: float
    acceptance: tuple[float, ...]
    # the draft model's extend forward after each verify, a part of overhead_ms (the GPU part that SGLang
    # 0.5.23's device timer reports as category eagle_draft_extend); the rest of overhead_ms is CPU time
    draft_extend_ms: float = 0.0
    # draft forwards per cycle = steps - draft_passes_offset: a real SGLang 0.5.17 EAGLE-3 worker takes the first
    # draft token from the draft-extend pass and runs steps - 1 draft forwards (0 at steps 1; the H200 known-truth
    # runs, docs/validation/known-truth.md); the seed-calibrated profiles keep 0
    draft_passes_offset: int = 0
    # the cycle's growth with the batch that is logarithmic in it: cycle factor = 1 + bs_slope*(bs-1) +
    # bs_log2_slope*log2(bs). A batched verify pass checks bs x draft tokens at once and costs far more than a decode
    # step of the same batch (h200-known-truth: fitted to the H200 concurrency stores, 1.64x at 8 in flight, 2.41x at 32)
    bs_log2_slope: float = 0.0


@dataclass(frozen=True)
class NcclProfile:
    tuned: Mapping[str, str]
    untuned_factor: float


@dataclass(frozen=True)
class NoiseProfile:
    step_cv: float
    request_cv: float
    instance_cv: float
    drift_pct_per_hour: float   # linear drift of the node's speed per simulated hour since the node epoch
    drift_max_pct: float        # the drift stops at this magnitude


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    gpu: GpuProfile
    model: ModelProfile
    load: LoadProfile
    decode: DecodeProfile
    prefill: PrefillProfile
    spec: SpecProfile
    nccl: NcclProfile
    noise: NoiseProfile
    source: str = field(default="", compare=False)

    def without_noise(self) -> "Profile":
        """The same profile with jitter, offsets and drift set to zero (for exact expectations)."""
        quiet = NoiseProfile(0.0, 0.0, 0.0, 0.0, 0.0)
        return dataclasses.replace(self, noise=quiet)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    missing = sorted(n for n in set(fields) - set(data) if fields[n].default is dataclasses.MISSING)
    if missing:
        raise ProfileError(f"{where}: missing key(s) {missing}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            continue
        value = data[name]
        ftype = f.type if isinstance(f.type, str) else f.type.__name__
        sub = _NESTED.get(ftype)
        if sub is not None:
            kwargs[name] = _build(sub, value, f"{where}.{name}")
        elif ftype == "tuple[float, ...]":
            if not isinstance(value, list) or not value:
                raise ProfileError(f"{where}.{name}: expected a non-empty list of probabilities")
            probs = tuple(float(v) for v in value)
            if any(not 0.0 <= p < 1.0 for p in probs):
                raise ProfileError(f"{where}.{name}: probabilities must be in [0, 1), got {list(probs)}")
            kwargs[name] = probs
        elif ftype == "Mapping[str, str]":
            if not isinstance(value, Mapping):
                raise ProfileError(f"{where}.{name}: expected a mapping of variable -> value")
            kwargs[name] = {str(k): str(v) for k, v in value.items()}
        elif ftype == "bool":
            if not isinstance(value, bool):
                raise ProfileError(f"{where}.{name}: expected true/false, got {value!r}")
            kwargs[name] = value
        elif ftype in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProfileError(f"{where}.{name}: expected a number, got {value!r}")
            kwargs[name] = int(value) if ftype == "int" else float(value)
        else:
            kwargs[name] = str(value)
    return cls(**kwargs)


_NESTED: dict[str, type] = {
    "GpuLook": GpuLook, "GpuProfile": GpuProfile, "ModelProfile": ModelProfile,
    "LoadProfile": LoadProfile, "DecodeProfile": DecodeProfile, "PrefillProfile": PrefillProfile,
    "SpecProfile": SpecProfile, "NcclProfile": NcclProfile, "NoiseProfile": NoiseProfile,
}


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yml"))


def profile_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Profile:
    if isinstance(data, Mapping) and "version" in data:
        raise ProfileError(f"{source}: 'version' is no longer a profile key: the SGLang release the simulator "
                           f"plays (and reports in /server_info) is SPECAB_SIM_SGLANG_VERSION (0.5.23 default, "
                           f"0.5.9). Remove the key.")
    prof = _build(Profile, data, source)
    if prof.gpu.count < 1:
        raise ProfileError(f"{source}: gpu.count must be >= 1")
    if not 0 <= prof.gpu.app_exit_lag_s <= prof.gpu.release_lag_s:
        raise ProfileError(f"{source}: gpu.app_exit_lag_s must be in [0, release_lag_s] (the compute-app entry "
                           "disappears before the memory is released)")
    if prof.noise.drift_max_pct < 0:
        raise ProfileError(f"{source}.noise.drift_max_pct must be >= 0")
    return dataclasses.replace(prof, source=source)


def load_profile(name_or_path: str | None) -> Profile:
    """Load a shipped profile by name (``default``) or a YAML file by path."""
    ref = name_or_path or "default"
    path = PROFILE_DIR / f"{ref}.yml"
    if not ("/" not in ref and path.is_file()):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ProfileError(
                f"SPECAB_SIM_PROFILE={ref!r}: neither a shipped profile ({', '.join(shipped_profiles())}) "
                f"nor a readable YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    return profile_from_dict(data, str(path))
