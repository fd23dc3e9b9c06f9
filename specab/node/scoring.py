#!/usr/bin/env python3
"""The baseline server scores outputs under the target, inside its own run after the measured window (stdlib only).

At temperature > 0 a speculative arm's outputs differ from its baseline's by design; what must hold is that they are
drawn from the target's distribution. A baseline run whose bench step carries a ``score`` spec (the driver gives one
to each baseline run at temperature > 0: ``specab.config.scoring``) asks its own server, still up after the last
measured request, for the target's log-probability of every output token of the runs the spec names: its own and the
runs of its speculative arms that ran on this node since the previous run of it. Each request costs one prefill
(no decode), so a run's scoring takes about the prefill time of its requests.

Per scored request: the prompt is rebuilt as the client built it (from the scored run's bench_summary.json: seed,
input length, dataset, known truth; checked against its ``dataset_hash``), tokenized by the server (``/tokenize``;
a token-id prompt as it is), and the prompt's ids followed by the output's ids are scored:

- SGLang (``/generate``): ``input_ids``, ``sampling_params.max_new_tokens`` 0, ``return_logprob`` true and
  ``logprob_start_len`` = prompt length - 1; ``meta_info.input_token_logprobs`` is ``[[logprob, id, text], ...]``
  from that position on, its first logprob None (SGLang 0.5.17 returns none for the token at logprob_start_len).
- vLLM (``/v1/completions``): the ids as the prompt, ``max_tokens`` 1, ``prompt_logprobs`` 0; ``choices[0].
  prompt_logprobs`` holds per prompt position ``{"<id>": {"logprob", "rank", "decoded_token"}}`` (None first).

Both are the raw distribution's log-probabilities (no temperature, no top_p). ``scores.jsonl`` in the run directory
gets one line per scored request as it is answered, ``{"run", "i", "tokens", "logprob_sum"}`` (``error`` instead of
the sums when it could not be scored), and a last line ``{"summary": {...}}``: what was scored, what was not and
why, and what it cost (``seconds``, ``requests``, ``tokens``).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

from specab.node import loadgen, osutil
from specab.vocab import dataset

SCORES_FILE = "scores.jsonl"
ENGINES = ("sglang", "vllm")


class ScoreError(Exception):
    """A request or run that cannot be scored (the reason is recorded, the scoring goes on)."""


def check_spec(score: Any) -> Dict[str, Any]:
    """A bench step's ``score`` spec: {"engine": sglang|vllm, "experiment_id", "runs": [run ids]}."""
    if not isinstance(score, dict) or score.get("engine") not in ENGINES or not isinstance(score.get("runs"), list) \
            or not all(isinstance(r, str) and r for r in score["runs"]) or not score.get("experiment_id"):
        raise ValueError("score must be {\"engine\": sglang|vllm, \"experiment_id\": ID, \"runs\": [run ids]}, got %r"
                         % (score,))
    return score


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------

def post_json(target: loadgen.Target, path: str, body: Dict[str, Any], timeout: float) -> Any:
    conn = target.connect(timeout)
    try:
        conn.request("POST", target.base_path + path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise ScoreError("%s answered %d: %s" % (path, resp.status, data[:300].decode("utf-8", "replace")))
        return json.loads(data)
    except (OSError, ValueError) as exc:
        raise ScoreError("%s: %s: %s" % (path, type(exc).__name__, exc))
    finally:
        conn.close()


class Scorer(object):
    """The server's tokenizer and scoring requests, with the prompts' ids cached (every arm has the same prompts)."""

    def __init__(self, engine: str, target: loadgen.Target, model: Optional[str], timeout: float) -> None:
        self.engine, self.target, self.model, self.timeout = engine, target, model, timeout
        self.prompt_ids: Dict[str, List[int]] = {}

    def ids_of(self, prompt: Any) -> List[int]:
        """The prompt's token ids as the server tokenizes it for the request the client sent."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        key = json.dumps(prompt, sort_keys=True)
        if key not in self.prompt_ids:
            body = {"model": self.model} if self.model else {}  # type: Dict[str, Any]
            if isinstance(prompt, dict) and "messages" in prompt:
                body.update(messages=prompt["messages"], add_generation_prompt=True)
            else:
                body["prompt"] = prompt["prompt"] if isinstance(prompt, dict) else prompt
            tokens = post_json(self.target, "/tokenize", body, self.timeout).get("tokens")
            if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
                raise ScoreError("/tokenize gave no token ids: %r" % (tokens,))
            self.prompt_ids[key] = tokens
        return self.prompt_ids[key]

    def logprobs(self, prompt: List[int], output: List[int]) -> List[float]:
        """The target's log-probability of each output token after the prompt."""
        if self.engine == "sglang":
            body = {"input_ids": prompt + output, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                    "return_logprob": True, "logprob_start_len": len(prompt) - 1, "stream": False}
            got = post_json(self.target, "/generate", body, self.timeout)
            rows = ((got or {}).get("meta_info") or {}).get("input_token_logprobs")
            if not isinstance(rows, list) or len(rows) != len(output) + 1:
                raise ScoreError("input_token_logprobs has %s entries for %d output tokens"
                                 % (len(rows) if isinstance(rows, list) else "no", len(output)))
            pairs = [(row[0], row[1]) for row in rows[1:]]
        else:
            body = {"model": self.model or "default", "prompt": prompt + output, "max_tokens": 1,
                    "temperature": 0.0, "prompt_logprobs": 0}
            got = post_json(self.target, "/v1/completions", body, self.timeout)
            rows = (((got or {}).get("choices") or [{}])[0]).get("prompt_logprobs")
            if not isinstance(rows, list) or len(rows) != len(prompt) + len(output):
                raise ScoreError("prompt_logprobs has %s entries for %d prompt and output tokens"
                                 % (len(rows) if isinstance(rows, list) else "no", len(prompt) + len(output)))
            pairs = [((row or {}).get(str(t), {}).get("logprob"), t) for row, t in zip(rows[len(prompt):], output)]
        if [t for _, t in pairs] != output or not all(isinstance(lp, (int, float)) for lp, _ in pairs):
            raise ScoreError("the server's log-probabilities are not those of the output's tokens")
        return [float(lp) for lp, _ in pairs]


# ---------------------------------------------------------------------------------------------
# One scored run
# ---------------------------------------------------------------------------------------------

def _prompts(run_dir: str, summary: Dict[str, Any]) -> List[Any]:
    """The measured prompts of a run as its client built them (loadgen.run_benchmark), checked by their hash."""
    seed, n, input_len = int(summary["seed"]), int(summary["requests"]), int(summary["input_len"])
    data = summary.get("dataset") or {}
    kt, _ = loadgen.known_truth_of(run_dir)
    if data.get("kind") == "file":
        prompts = dataset.sample(dataset.load(str(data["path"])), seed, "measure", n)  # type: List[Any]
    elif kt is not None:
        first, vocab = int(kt["target"]["first"]), int(kt["target"]["vocab_size"])
        prompts = loadgen.make_token_prompts(seed, "measure", n, input_len, first, vocab)
    else:
        prompts = loadgen.make_prompts(seed, "measure", n, input_len)
    if loadgen.dataset_hash(prompts) != summary.get("dataset_hash"):
        raise ScoreError("its prompts could not be rebuilt (dataset hash %s, rebuilt %s)"
                         % (summary.get("dataset_hash"), loadgen.dataset_hash(prompts)))
    return prompts


def measured_records(run_dir: str) -> List[Dict[str, Any]]:
    """The run's measured, answered records in bench.jsonl (a line that does not parse, cut short or with bytes that
    are not UTF-8, is passed over: read as bytes, each line is decoded on its own)."""
    out = []
    with open(os.path.join(run_dir, "bench.jsonl"), "rb") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue            # a line cut short, or not UTF-8
            if isinstance(rec, dict) and not rec.get("warmup") and rec.get("ok"):
                out.append(rec)
    return out


def _belongs(run_dir: str, experiment_id: str) -> bool:
    """Whether a run directory holds a run of this experiment (its manifest or queue entry says so): a run id is
    reused by every experiment on the node."""
    for name, key in (("manifest.json", ("extra", "experiment_id")), ("queue_entry.json", ("experiment_id",))):
        doc = osutil.json_or_none(os.path.join(run_dir, name))
        for k in key:
            doc = doc.get(k) if isinstance(doc, dict) else None
        if doc is not None:
            return doc == experiment_id
    return False


def score_run(scorer: Scorer, run_id: str, run_dir: str, write: Callable[[Dict[str, Any]], None]
              ) -> Dict[str, Any]:
    """Score every measured, answered request of one run; {"scored", "unscored", "tokens", "reason"}."""
    try:
        with open(os.path.join(run_dir, "bench_summary.json"), encoding="utf-8") as fh:
            summary = json.load(fh)
        prompts = _prompts(run_dir, summary)
        records = measured_records(run_dir)
    except (OSError, ValueError, KeyError, TypeError, dataset.DatasetError) as exc:
        raise ScoreError("its results cannot be read (%s: %s)" % (type(exc).__name__, exc))
    done = {"scored": 0, "unscored": 0, "tokens": 0, "reason": None}  # type: Dict[str, Any]
    for rec in records:
        i, ids = rec.get("i"), rec.get("output_ids")
        try:
            if not isinstance(i, int) or not 0 <= i < len(prompts):
                raise ScoreError("request index %r is not one of the run's %d prompts" % (i, len(prompts)))
            if not isinstance(ids, list) or not ids:
                raise ScoreError("no output ids (the server sent text only)" if ids is None else "no output tokens")
            logps = scorer.logprobs(scorer.ids_of(prompts[i]), [int(t) for t in ids])
        except ScoreError as exc:
            done["unscored"] += 1
            done["reason"] = done["reason"] or str(exc)
            write({"run": run_id, "i": i, "error": str(exc)})
            continue
        done["scored"] += 1
        done["tokens"] += len(logps)
        write({"run": run_id, "i": i, "tokens": len(logps), "logprob_sum": sum(logps)})
    return done


def score(spec: Dict[str, Any], run_dir: str, url: str, model: Optional[str], timeout: float,
          log: Callable[[str], None] = lambda s: None) -> Dict[str, Any]:
    """Score the runs of ``spec`` (check_spec) with the server at ``url``; write ``<run_dir>/scores.jsonl``; return
    the summary (its last line)."""
    t0 = time.monotonic()
    own = os.path.basename(os.path.normpath(run_dir))
    target = loadgen.Target.from_url(url)
    if model is None and spec["engine"] == "vllm":
        model = loadgen.discover_model(target, timeout)
    scorer = Scorer(spec["engine"], target, model, timeout)
    runs = {}  # type: Dict[str, Any]
    with open(os.path.join(run_dir, SCORES_FILE), "w", encoding="utf-8") as fh:
        def write(rec: Dict[str, Any]) -> None:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            fh.flush()

        for run_id in spec["runs"]:
            d = os.path.join(os.path.dirname(os.path.normpath(run_dir)), run_id)
            try:
                if run_id != own and not _belongs(d, spec["experiment_id"]):
                    raise ScoreError("no run of experiment %s at %s" % (spec["experiment_id"], d))
                runs[run_id] = score_run(scorer, run_id, d, write)
            except ScoreError as exc:
                runs[run_id] = {"scored": 0, "unscored": None, "tokens": 0, "reason": str(exc)}
            log("scored %s: %s" % (run_id, runs[run_id]))
        summary = {"scorer": own, "engine": spec["engine"], "runs": runs,
                   "requests": sum(r["scored"] for r in runs.values()),
                   "tokens": sum(r["tokens"] for r in runs.values()),
                   "seconds": round(time.monotonic() - t0, 3)}
        write({"summary": summary})
    return summary

