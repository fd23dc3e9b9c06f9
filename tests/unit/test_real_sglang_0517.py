"""The node tools, the client, the parser and the engine knowledge on what a REAL SGLang 0.5.17 EAGLE-3 server
printed and answered on an H200 (tests/fixtures/sglang-0.5.17/: its log, --help, /server_info, /metrics, a
streamed /generate, process list and environ; docs/validation/sglang-real.md). Not simulator output."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from specab.analysis.evidence import logparse
from specab.driver.preflight import parse_help_flags
from specab.node import envcheck, envfile, loadgen, procfs, ready, stop
from specab.vocab import engines

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.17"
NODE = Path(__file__).resolve().parents[2] / "specab" / "node"


def _stream_events(name: str) -> list[dict]:
    events = []
    for line in (FIX / name).read_text().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


def test_ready_sees_the_real_0517_load_phases_and_graph_capture(tmp_path):
    """The 0.5.17 capture lines (`Capture target verify CUDA graph begin. backend=full, ...`) were not recognised
    before (ready.json's capture_cuda_graph_s was null and the live display said 'capturing graphs  s')."""
    w = ready.LogWatcher(str(tmp_path / "x.log"))
    phases_seen = []
    for line in (FIX / "eagle3.log").read_text().splitlines():
        w.feed(line)
        if not phases_seen or phases_seen[-1] != w.phase():
            phases_seen.append(w.phase())
    assert phases_seen == ["starting", "loading weights", "weights loaded", "capturing graphs", "graphs captured",
                           "capturing graphs", "graphs captured", "ready line logged"]
    assert w.phases["capture_cuda_graph_begin"]["log_time"] == "2026-12-01 03:27:07"
    assert w.fatal is None


def test_ready_takes_the_load_durations_from_the_real_startup_timings_line(tmp_path):
    """`Engine startup timings (s): load_weight=0.09, ..., cuda_graph={..., target_verify=1.46, ...}`: the engine's
    own seconds (10 ms) for the weight load and the target's graphs; without the line, the capture lines' whole-
    second timestamps (the live phases come from those lines either way)."""
    lines = (FIX / "eagle3.log").read_text().splitlines()
    line = next(ln for ln in lines if engines.STARTUP_TIMINGS_PREFIX in ln)
    t = engines.parse_startup_timings(line)
    assert t == {"load_weight": 0.09, "kv_cache_allocation": 0.39, "scheduler_e2e": 6.66,
                 "cuda_graph": {"prefill": 0.0, "decode": 0.0, "target_verify": 1.46, "draft_prefill": 0.0,
                                "draft_decode": 0.96, "draft_extend": 1.02}, "tokenizer_e2e": 25.71}
    with_line, without = ready.LogWatcher(str(tmp_path / "a.log")), ready.LogWatcher(str(tmp_path / "b.log"))
    for ln in lines:
        with_line.feed(ln)
        if ln is not line:
            without.feed(ln)
    assert with_line.startup_timings == t and without.startup_timings is None
    assert with_line.durations() == {"load_weights_s": 0.09, "capture_cuda_graph_s": 1.46, "weights_to_ready_s": 7.0}
    assert with_line.durations_source() == {"load_weights_s": "startup_timings",
                                            "capture_cuda_graph_s": "startup_timings",
                                            "weights_to_ready_s": "log_lines"}
    assert without.durations() == {"load_weights_s": 0.0, "capture_cuda_graph_s": 2.0, "weights_to_ready_s": 7.0}
    assert set(without.durations_source().values()) == {"log_lines"}
    def logged(w: ready.LogWatcher) -> dict:             # seen_at is this process's clock when it read the line
        return {k: {f: v for f, v in ph.items() if f != "seen_at"} for k, ph in w.phases.items()}
    assert logged(with_line) == logged(without) and with_line.phase() == without.phase() == "ready line logged"
    # the baseline's line: the decode graphs alone (2.08 s, the capture lines say 03:26:14 -> 03:26:16)
    base = next(ln for ln in (FIX / "baseline.log").read_text().splitlines() if engines.STARTUP_TIMINGS_PREFIX in ln)
    assert engines.startup_durations(engines.parse_startup_timings(base)) == {"load_weights_s": 0.08,
                                                                             "capture_cuda_graph_s": 2.08}
    assert engines.parse_startup_timings(lines[0]) is None


def test_the_client_reads_spec_fields_from_the_real_final_chunk_only():
    events = _stream_events("eagle3.stream")
    assert not any("spec_verify_ct" in e["meta_info"] for e in events[:-1]), "fixture: final chunk only"
    counter = loadgen.ChunkCounter("generate")
    for e in events:
        counter.feed(e)
    rec = {"chunk_t_s": [0.01 * (i + 1) for i in range(len(events))], "chunk_tokens": [1] * len(events)}
    loadgen._finish_record(rec, counter, 0.01 * (len(events) + 1))
    final = events[-1]["meta_info"]
    assert rec["output_tokens"] == final["completion_tokens"] == 200
    assert rec["spec_verify_ct"] == final["spec_verify_ct"] == 199
    # tokens per verify pass: the engine's own spec_accept_length (1.005), from the real meta_info
    assert rec["accept_len"] == pytest.approx(final["spec_accept_length"], rel=1e-9)


def test_both_generations_of_spec_field_names_in_the_real_final_chunk():
    meta = _stream_events("eagle3.stream")[-1]["meta_info"]
    # 0.5.17 sends both the older and the newer names; the engine knowledge reads either
    assert meta["spec_accepted_drafts"] == meta["spec_num_correct_drafts"] == 0
    spec = engines.spec_meta(meta)
    assert spec["spec_num_proposed_drafts"] == 398 and spec["spec_num_correct_drafts"] == 0


def test_logparse_reads_the_real_0517_decode_and_prefill_lines():
    s = logparse.summarize(logparse.iter_records((FIX / "eagle3.log").read_text().splitlines()))
    assert s["counts"]["decode"] == s["accept_len_lines"] == 110 and s["prefill_lines"] == 6
    assert s["accept_len_mean"] == pytest.approx(1.0, abs=0.01)        # a dummy draft accepts nothing
    assert s["cuda_graph_share"] == 1.0 and s["ready_ts"] == "2026-12-01 03:27:14"
    # the three 0.5.17 capture pairs (target verify, draft decode, draft extend) are each seen
    lp = s["load_phases"]
    assert lp["graph_begin_target"] == "2026-12-01 03:27:07" and lp["graph_end_draft_extend"] == "2026-12-01 03:27:11"
    assert s["capacity"]["max_running_requests"] == 48


def test_parse_log_numbers_the_real_0517_lines_as_the_file_does(capsys):
    """The real 0.5.17 log holds tqdm bars ("Capturing batches ...") that redraw with bare carriage returns inside one
    line: a record's `line` is still the line of the file (as `grep -n` and `sed -n Np` count), with what it read."""
    path = FIX / "eagle3.log"
    assert logparse.main([str(path), "--format", "json"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()][:-1]
    file_lines = path.read_bytes().decode("utf-8").split("\n")
    marks = {"decode": "Decode batch, ", "prefill": "Prefill batch, ", "ready": "The server is fired up",
             "capacity": "max_total_num_tokens="}
    assert {r["kind"] for r in recs} >= set(marks)
    for r in recs:
        assert marks.get(r["kind"], "[2026-12-01 ") in file_lines[r["line"] - 1], r
    ends = [r for r in recs if r.get("phase") == "graph_end"]
    assert file_lines[ends[0]["line"] - 1].startswith("[2026-12-01 03:27:09] Capture target verify CUDA graph end.")


def test_the_real_0517_help_is_the_new_graph_flag_generation_and_spells_per_phase():
    flags = parse_help_flags((FIX / "help-0.5.17.txt").read_text())
    assert {"--cuda-graph-backend-decode", "--cuda-graph-max-bs-decode", "--speculative-algorithm"} <= flags
    # the version string decides where the flag set is ambiguous: 0.5.17 behaves like 0.5.23 here
    assert engines.generation_of_version("0.5.17") == engines.SGLANG_0_5_23
    spelled = engines.spell_args({"cuda_graph_max_bs": 16, "tp_size": 1}, flags)
    assert "tp_size" in spelled and any(k.startswith("cuda_graph_max_bs") for k in spelled)


def test_the_real_0517_flag_set_is_read_as_the_generation_its_version_is():
    """The real 0.5.17 --help lists the per-phase graph flags and keeps `--cuda-graph-max-bs` as a deprecated alias
    of `--cuda-graph-max-bs-decode`: the flag set is the 0.5.23 generation, as its version says (preflight names
    the flag set by it: "SGLang 0.5.23 flags")."""
    flags = parse_help_flags((FIX / "help-0.5.17.txt").read_text())
    assert "--cuda-graph-max-bs" in flags and "--cuda-graph-backend-decode" in flags
    assert engines.generation_of_flags(flags) == engines.generation_of_version("0.5.17") == engines.SGLANG_0_5_23


def test_the_real_process_titles_and_environ():
    ps = (FIX / "eagle3.ps").read_text().splitlines()
    titles = [line.split(None, 3)[3] for line in ps if line.strip()]
    assert titles[0].startswith("python3 -m sglang.launch_server")        # the main process is untitled
    assert "sglang::scheduler" in titles and "sglang::detokenizer" in titles
    assert not any("_TP0" in t for t in titles)                          # TP 1: no rank suffix
    env = dict(kv.split("=", 1) for kv in (FIX / "eagle3.environ-sched").read_text().splitlines()
               if "=" in kv)
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "8"


# --------------------------------------------------------------------------- env verification on the real processes

def _env_lines(path: Path) -> dict:
    """A real environ excerpt (``VAR=value`` lines; a ``== pid title`` header line is skipped)."""
    return dict(ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln and not ln.startswith("=="))


def _launch(path: Path) -> tuple:
    """(exported env, engine argv) of a real launch.sh that specab rendered (templates/launch_server.sh.j2)."""
    text = path.read_text()
    env = {m.group(1): m.group(2) for m in re.finditer(r"^export (\w+)=(\S+)$", text, re.M)}
    exec_line = text[text.index("\nexec ") + 6:].replace("\\\n", " ")
    return env, [w for w in shlex.split(exec_line) if w != "$@"]


def _fake_proc(root: Path, without: tuple = ()) -> int:
    """A /proc of the four processes of the real EAGLE-3 server that specab's env verification saw on the H200
    (SPECAB_RUN eagle3-s2: pids and titles as its env_check.json recorded them, the command its launch.sh
    exec'd, comm as `ps` showed it). environ: the image's (eagle3.environ-main), the launch script's exports and
    its nccl.env (``without``: the names `env -u` removed); the scheduler also gets what the server set for it
    (eagle3.environ-sched). The resource tracker's command is CPython's (the run kept its first 60 characters).
    Returns the main pid."""
    rec = json.loads((SPECAB_RUN / "eagle3-s2.env_check.json").read_text())
    pids = [p["pid"] for p in rec["processes"]]
    exported, argv = _launch(SPECAB_RUN / "eagle3-s2.launch.sh")
    base = dict(_env_lines(FIX / "eagle3.environ-main"), **exported)
    base.update(envfile.parse_env_file(str(SPECAB_RUN / "eagle3-s2.nccl.env")))
    main, tracker, sched, detok = pids
    table = {
        main: ("python3", 1, argv, base),
        tracker: ("python3", main, [argv[0], "-B", "-c", "from multiprocessing.resource_tracker import main;main(7)"],
                  base),
        sched: ("sglang::schedul", main, ["sglang::scheduler"], dict(base, **_env_lines(FIX / "eagle3.environ-sched"))),
        detok: ("sglang::detoken", main, ["sglang::detokenizer"], base),
    }
    for pid, (comm, ppid, cmd, env) in table.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        rest = ["S", str(ppid), str(main), str(main)] + ["0"] * 15 + [str(pid)] + ["0"] * 30
        (d / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(rest)))
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(b"\0".join(w.encode() for w in cmd) + b"\0")
        (d / "environ").write_bytes(b"".join(("%s=%s" % kv).encode() + b"\0" for kv in env.items()
                                             if kv[0] not in without))
    return main


def test_envcheck_on_the_real_processes_finds_every_variable_as_it_did_on_the_h200(tmp_path, monkeypatch):
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    main = _fake_proc(tmp_path)
    real = json.loads((SPECAB_RUN / "eagle3-s2.env_check.json").read_text())
    procs = envcheck.engine_processes(main)
    assert sorted(p["pid"] for p in procs) == sorted(p["pid"] for p in real["processes"])
    names = {p["pid"]: p["name"] for p in procs}
    assert names[main].startswith("python3 -m sglang.launch_server --model-path /tmp/m/target")   # untitled
    others = sorted(n for pid, n in names.items() if pid != main)
    assert others[0].startswith("python3 -B -c from multiprocessing.res") and others[1:] == [
        "sglang::detokenizer", "sglang::scheduler"]                          # TP 1: no _TP0
    assert not any(p["skipped"] for p in procs)
    expected = envfile.parse_env_file(str(SPECAB_RUN / "eagle3-s2.nccl.env"))
    nccl = envcheck.parse_nccl_lines((FIX / "eagle3.log").read_text())
    assert len(nccl) == real["nccl_lines"] == 0, "TP 1: no communicator, no NCCL echo lines"
    variables = envcheck.check_environ(expected, procs, nccl)
    envcheck.check_nccl(expected, nccl, procs, variables)
    # the same verdict, variable by variable and process by process, as envcheck gave on the H200
    assert {v: dict(r, evidence=sorted(r["evidence"])) for v, r in variables.items()} == \
        {v: dict(r, evidence=sorted(r["evidence"])) for v, r in real["variables"].items()}


def test_envcheck_finds_what_the_real_server_set_only_in_its_scheduler(tmp_path, monkeypatch):
    """SGLang sets NCCL_CUMEM_ENABLE=0 and CUDA_DEVICE_MAX_CONNECTIONS=8 in its own os.environ after it started:
    /proc shows them in the scheduler it spawns, not in the main process's exec-time environ."""
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    main = _fake_proc(tmp_path)
    procs = envcheck.engine_processes(main)
    sched = next(p["pid"] for p in procs if p["name"] == "sglang::scheduler")
    got = envcheck.check_environ({"NCCL_CUMEM_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}, procs, [])
    for var, want in (("NCCL_CUMEM_ENABLE", "0"), ("CUDA_DEVICE_MAX_CONNECTIONS", "8")):
        assert "environ:%d" % sched in got[var]["evidence"]
        assert any(m.startswith("%s: expected %r in every engine process, but python3 -m sglang.launch_server"
                                % (var, want)) and "(pid %d) does not have it" % main in m
                   for m in got[var]["mismatches"])


def test_envcheck_names_the_real_scheduler_when_an_arm_lacks_nccl_algo(tmp_path, monkeypatch):
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    main = _fake_proc(tmp_path, without=("NCCL_ALGO",))        # the arm started with `env -u NCCL_ALGO`
    procs = envcheck.engine_processes(main)
    sched = next(p["pid"] for p in procs if p["name"] == "sglang::scheduler")
    expected = envfile.parse_env_file(str(SPECAB_RUN / "eagle3-s2.nccl.env"))
    variables = envcheck.check_environ(expected, procs, [])
    assert [v for v, r in variables.items() if r["mismatches"]] == ["NCCL_ALGO"]
    assert len(variables["NCCL_ALGO"]["mismatches"]) == 4 and not variables["NCCL_ALGO"]["evidence"]
    # the words the validation's real run printed for its scheduler (gpu_validation-summary.txt), for this one
    real = re.search(r"NCCL_ALGO: expected 'Ring' in every engine process, but sglang::scheduler \(pid (\d+)\) does "
                     r"not have it", (FIX / "gpu_validation-summary.txt").read_text())
    assert real.group(0).replace("pid %s" % real.group(1), "pid %d" % sched) in variables["NCCL_ALGO"]["mismatches"]


def _args_of(ps_line: str) -> dict:
    """The server args of a real `ps` line's command (``--flag value``; a bare ``--flag`` is true)."""
    words = ps_line.split(None, 3)[3].split()
    words = words[words.index("sglang.launch_server") + 1:]
    args = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            args[w[2:].replace("-", "_")] = True if nxt.startswith("--") else nxt
    return args


@pytest.mark.parametrize("arm, n_args", [("baseline", 10), ("eagle3", 15)])
def test_envcheck_reads_the_real_servers_args_back_from_its_get_server_info(arm, n_args):
    info = json.loads((FIX / f"{arm}.server_info.json").read_text())
    expected = _args_of((FIX / f"{arm}.ps").read_text().splitlines()[0])      # the command the server ran
    assert len(expected) == n_args
    report, problems = envcheck.check_args(expected, info)
    assert problems == [] and all(r["ok"] for r in report.values()), problems
    eng = envcheck.engine_readback(info)
    assert (eng["version"], eng["generation"], eng["graph_readback"]) == ("0.5.17", engines.SGLANG_0_5_23,
                                                                          "cuda_graph_config")
    assert eng["decode_graph_disabled"] is False
    # a value the server does not run with is caught, naming both
    report, problems = envcheck.check_args(dict(expected, mem_fraction_static=0.8), info)
    assert problems == ["server arg mem_fraction_static: expected 0.8, but the server runs with 0.5"]


# --------------------------------------------------------------------------- the shutdown stop.json records

SPECAB_RUN = FIX / "specab-run"     # specab's ab_test.yml against the real 0.5.17 on the H200: files of its runs
NOT_PARENT = {"observable": False, "why": "the server is not a child of this process"}   # the per-run stop.py


def _at_start(rec: dict) -> list:
    """The processes a real stop.json saw at its start, as the ProcStats stop.py had then."""
    return [procfs.ProcStat(p["pid"], "python3", "S", 1, rec["pgid"], rec["sid"], 0) for p in rec["processes_at_start"]]


def _tail_after_sigterm(log: str) -> str:
    lines = log.splitlines()
    i = next(i for i, ln in enumerate(lines) if engines.SHUTDOWN_SIGTERM_LINE in ln)
    return "\n".join(lines[i:]) + "\n"


@pytest.mark.parametrize("arm", ["baseline", "eagle3-s2"])
def test_stop_records_the_real_0517_shutdown_after_our_group_sigterm(arm):
    """What the real 0.5.17 logged while specab's stop.py (SIGTERM to the process group) stopped it: the drain
    begun, the scheduler dead of that SIGTERM (-15), SIGQUIT, kill_process_tree(include_parent=True)."""
    rec = json.loads((SPECAB_RUN / f"{arm}.stop.json").read_text())
    text = (SPECAB_RUN / f"{arm}.stop.log").read_text()
    sd = stop.shutdown_record(text, _at_start(rec), rec["pid"], False, NOT_PARENT)
    assert sd["style"] == engines.SHUTDOWN_TREE_KILL == engines.shutdown_style_of_version("0.5.17")
    assert sd["kill_tree"] == {"parent_pid": rec["pid"], "include_parent": True, "pid": rec["pid"]}
    assert sd["drain_begun"] and sd["drain_lines"] == 0, "the group SIGTERM took the scheduler: no drain finished"
    sched = next(p["pid"] for p in rec["processes_at_start"] if p["name"] == "sglang::scheduler")
    assert sd["children_crashed"] == [{"name": "scheduler_0", "pid": sched, "exit_code": -15}] and sd["sigquit_seen"]
    assert sorted(sd["children"]) == sorted(p["pid"] for p in rec["processes_at_start"][1:])
    assert sd["main_exit"] == NOT_PARENT and sd["children_gone_before_our_kill"]
    # the engine's clock (whole seconds) against stop's own: 6 s from its SIGTERM line to kill_process_tree,
    # all gone 5.88 s / 6.19 s after stop's SIGTERM
    assert sd["log_sigterm_to_kill_tree_s"] == 6.0
    assert abs(rec["term_to_gone_s"] - sd["log_sigterm_to_kill_tree_s"]) < 1.0
    # the run queue's sequencer is the server's parent: it sees the SIGKILL status as well
    seen = stop.shutdown_record(text, _at_start(rec), rec["pid"], False, {"observable": True, "signal": 9, "status": -9})
    assert seen["style"] == engines.SHUTDOWN_TREE_KILL


def test_stop_records_the_real_0517_drain_when_only_the_main_process_is_signalled():
    """The hand-run on the H200 (SIGTERM to the main process alone, the shell waiting for it): the drain runs to
    `Gracefully exiting... Remaining number of requests 0`, then kill_process_tree; the shell saw status 137."""
    text = _tail_after_sigterm((FIX / "eagle3.log").read_text())
    status = int(re.search(r"eagle3: main exit status (\d+)", (FIX / "summary.txt").read_text()).group(1))
    assert status == 128 + 9
    exit_info = {"observable": True, "signal": status - 128, "status": -(status - 128)}
    sd = stop.shutdown_record(text, [], 2989, False, exit_info)
    assert sd["style"] == engines.SHUTDOWN_TREE_KILL and sd["main_exit"]["signal"] == 9
    assert sd["drain_begun"] and sd["drain_lines"] == 1 and "Remaining number of requests 0" in sd["drain_last"]
    assert sd["children_crashed"] == [] and not sd["sigquit_seen"]
    assert sd["kill_tree"] == {"parent_pid": 2989, "include_parent": True, "pid": 2989}
    assert sd["log_sigterm_to_kill_tree_s"] == 5.0


def test_a_real_0517_stop_without_its_evidence_is_not_called_a_tree_kill():
    rec = json.loads((SPECAB_RUN / "eagle3-s2.stop.json").read_text())
    text = (SPECAB_RUN / "eagle3-s2.stop.log").read_text()
    cut = "".join(ln for ln in text.splitlines(True) if "kill_process_tree" not in ln)
    sd = stop.shutdown_record(cut, _at_start(rec), rec["pid"], False, NOT_PARENT)
    assert sd["style"] == engines.SHUTDOWN_UNSEEN and sd["kill_tree"] is None and sd["drain_begun"]
    # a kill_process_tree of another process (a child's own) is not the main process ending itself
    other = stop.shutdown_record(text, _at_start(rec), rec["pid"] + 1, False, NOT_PARENT)
    assert other["style"] == engines.SHUTDOWN_UNSEEN
    assert stop.shutdown_record(text, _at_start(rec), rec["pid"], True, NOT_PARENT)["style"] == "killed-by-stop"


def test_which_versions_shut_down_which_way():
    version = json.loads((FIX / "eagle3.server_info.json").read_text())["version"]
    assert version == "0.5.17" and engines.shutdown_style_of_version(version) == engines.SHUTDOWN_TREE_KILL
    assert engines.shutdown_style_of_version("0.5.9") == engines.SHUTDOWN_TREE_KILL
    assert engines.shutdown_style_of_version("0.5.23") == engines.SHUTDOWN_REQ
    assert engines.shutdown_style_of_version("0.5.20") is None, "between 0.5.17 and 0.5.23 nobody has looked"
    assert engines.shutdown_style_of_version("") is None


# --------------------------------------------------------------------------- a real experiment, stored

REAL_EXP = FIX / "experiment-real"     # driver.py on the H200 with the real 0.5.17 (docs/validation/sglang-real.md)


def test_the_analysis_reads_a_real_engine_experiment(tmp_path):
    import shutil

    from specab.analysis.evidence import model
    from specab.analysis.measures import stats
    from specab.analysis.findings import doctor
    from specab.analysis.render import report

    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    shutil.copy(REAL_EXP / "results.sqlite", exp_dir / "results.sqlite")
    e = model.load_store(exp_dir)
    assert sorted(a.name for a in e.arms) == ["baseline", "eagle3-s2"] and len(e.runs) == 4
    assert all(r.status == "ok" for r in e.runs)
    spec = [r for r in e.runs if r.arm == "eagle3-s2"]
    assert {r.manifest["versions"]["sglang"] for r in spec} == {"0.5.17"}
    # per-request accept length from the real meta_info: 128 tokens over 127 verify passes
    assert {round(q.accept_len, 6) for r in spec for q in r.requests if not q.warmup} == {round(128 / 127, 6)}
    assert all(r.env_check and r.env_check.variables and not r.env_check.unconfirmed() for r in e.runs)
    s = stats.analyse(e)
    assert s is not None
    rules = {f.rule for f in doctor.diagnose(e)}
    assert "accept-below-break-even" in rules          # a dummy draft accepts nothing: speculation must lose
    paths = report.write_report(exp_dir)
    assert "eagle3-s2" in (exp_dir / "report.md").read_text() and paths["html"]


def test_make_demos_view_of_the_real_h200_round_is_its_table(tmp_path):
    """scripts/demo_view.py (what `make demo` prints) on the whole output of ab_test.yml against the real 0.5.17
    EAGLE-3 server on the H200 (the merged-tree re-run, docs/validation/sglang-real.md): the arm steps, the
    experiment line and the real table, nothing else of its 500 lines; the log keeps every line."""
    import subprocess
    real = (FIX / "merged-tree-rerun" / "ab_test.log").read_text()
    log = tmp_path / "demo-ansible.log"
    view = subprocess.run([sys.executable, str(NODE.parents[1] / "scripts" / "demo_view.py"), str(log)], input=real,
                          capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert log.read_text() == real
    assert len(view) <= 20 < len(real.splitlines())
    assert view[1] == "Experiment gpuval-ab-tp1 (/work/main/experiments/real-sglang.yml): arms baseline, eagle3-s2 on gpu0"
    assert [v.strip() for v in view if v.strip().startswith(("Start | Start arm", "Bench | Benchmark arm"))] == [
        "Start | Start arm baseline ...", "Bench | Benchmark arm baseline ...",
        "Start | Start arm eagle3-s2 ...", "Bench | Benchmark arm eagle3-s2 ..."]
    table = [v.split() for v in view if v.startswith(("arm ", "baseline ", "eagle3-s2 "))]
    assert table == [["arm", "requests", "tok/s", "(median)", "TTFT", "(ms)", "accept", "len", "speedup"],
                     ["baseline", "4/4", "678.1", "14", "-", "1.00x"],
                     ["eagle3-s2", "4/4", "192.9", "25", "1.01", "0.28x"]]
    assert view[-1] == f"full Ansible output: {log}"
