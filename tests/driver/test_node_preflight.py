"""Settings the node decides, checked against it before any server starts: the GPUs an arm's server takes against
the GPUs the host has and CUDA_VISIBLE_DEVICES shows, an arm's prompts and answers against its model's own context
length (its config.json on the node), the node directory's room. Each refused run starts nothing: no experiment
directory, nothing written on the node (its node directory, where the lease would be the first write, is not even
created: nvidia-smi, the model's config and the disk are only read), no server."""
from __future__ import annotations

import io
import json
import subprocess
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import yaml

from specab.driver import cli
from tests.driver.simnode import SimNode, free_port


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    """One simulated 8-GPU node for the module: only its nvidia-smi and files are read, no server starts."""
    return SimNode(root=tmp_path_factory.mktemp("node"), port=free_port())


def experiment(sim: SimNode, tmp_path: Path, **changes) -> Path:
    """The simulated node's experiment with `changes`: `server_args`, `env`, `bench` mappings merged in, `model_path`."""
    exp = yaml.safe_load(sim.write_experiment("np").read_text())["specab_experiment"]
    for key in ("server_args", "env", "bench"):
        exp[key].update(changes.pop(key, {}))
    exp.update(changes)
    p = tmp_path / "exp.yml"
    p.write_text(yaml.safe_dump({"specab_experiment": exp}, sort_keys=False))
    return p


def refused_run(sim: SimNode, exp: Path, tmp_path: Path) -> str:
    """`driver.py run`, refused before anything started: its message."""
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(["-e", str(exp), "-i", str(sim.write_inventory()), "--runs-dir", str(tmp_path / "runs")], out=out)
    assert rc == 2, (rc, out.getvalue()[-3000:], err.getvalue())
    assert "Nothing was started." in err.getvalue()
    assert list((tmp_path / "runs").iterdir()) == [] and sim.server() is None and not sim.node_dir.exists()
    return err.getvalue()


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_tp_size_above_the_nodes_gpus_is_refused_before_any_server_starts(sim: SimNode, tmp_path: Path) -> None:
    """`tp_size: 16` on an 8-GPU node: servers started and died ("GPU 15 does not exist")."""
    exp = experiment(sim, tmp_path, server_args={"tp_size": 16})
    msg = refused_run(sim, exp, tmp_path)
    assert (f"arm baseline on simT: its server takes 16 GPU(s) (tp_size 16: server_args.tp_size at "
            f"{exp}:{line_of(exp, 'tp_size: 16')}:5) but simT has 8 (nvidia-smi)") in msg, msg


def test_cuda_visible_devices_showing_fewer_gpus_than_the_server_takes_is_refused(sim: SimNode, tmp_path: Path) -> None:
    """`CUDA_VISIBLE_DEVICES: "4,5,6,7"` with TP 8: the servers died of CUDA out of memory."""
    exp = experiment(sim, tmp_path, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    msg = refused_run(sim, exp, tmp_path)
    assert (f"arm eagle3-s2 on simT: CUDA_VISIBLE_DEVICES='4,5,6,7' (env.CUDA_VISIBLE_DEVICES at "
            f"{exp}:{line_of(exp, 'CUDA_VISIBLE_DEVICES')}:5) shows 4 GPU(s), fewer than the 8 the server takes "
            f"(tp_size 8: server_args.tp_size at {exp}:{line_of(exp, 'tp_size: 8')}:5)") in msg, msg


def test_cuda_visible_devices_is_checked_for_duplicates_and_indices_the_node_lacks() -> None:
    from specab.driver import nodecheck
    gpus = nodecheck.Gpus(indices=tuple(map(str, range(8))), uuids=tuple(f"GPU-{i}" for i in range(8)))
    assert nodecheck.visible_problem("0,1,1,2", gpus, 4) == "names GPU 1 more than once"
    assert nodecheck.visible_problem("6,7,8,9", gpus, 4) == \
        "names GPU 8, 9, which the host does not have (nvidia-smi lists 0, 1, 2, 3, 4, 5, 6, 7)"
    assert nodecheck.visible_problem("GPU-3,GPU-5", gpus, 2) is None
    assert nodecheck.visible_problem("0,1,2,3,4,5,6,7", gpus, 8) is None


def model_dir(tmp_path: Path, context: int) -> Path:
    """A model folder as a node holds one: its config.json is what the engine derives the context length from."""
    m = tmp_path / "models" / "target"
    m.mkdir(parents=True)
    (m / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                               "max_position_embeddings": context}))
    return m


def test_a_4mb_prompt_is_refused_against_the_models_own_context_before_any_server_starts(
        sim: SimNode, tmp_path: Path) -> None:
    """A 4 MB prompt failed only after both servers started; the limit is the model's own (no context_length set):
    read from its config.json on the node."""
    m = model_dir(tmp_path, 262144)
    words = ("the speculative draft proposes tokens " * 200_000).strip()      # 4.4 MB, 1,000,000 words
    (tmp_path / "big.jsonl").write_text(json.dumps({"prompt": words}) + "\n")
    exp = experiment(sim, tmp_path, model_path=str(m), bench={"dataset": str(tmp_path / "big.jsonl")})
    msg = refused_run(sim, exp, tmp_path)
    assert (f"arm baseline: the prompt has at least 1000000 tokens (record 1 of bench.dataset {tmp_path}/big.jsonl: "
            f"1000000 words), not below the context length of 262144 tokens (max_position_embeddings 262144 in {m}/"
            f"config.json on simT, the model's own: the launch sets no context_length): the engine refuses it") in msg


def test_an_output_len_beyond_the_models_context_is_refused_naming_the_length(sim: SimNode, tmp_path: Path) -> None:
    """`output_len: 10000000` started both servers and failed after 136 s with "no data ... request timeout"."""
    m = model_dir(tmp_path, 262144)
    exp = experiment(sim, tmp_path, model_path=str(m), bench={"output_len": 10_000_000})
    msg = refused_run(sim, exp, tmp_path)
    assert (f"arm eagle3-s2: the prompt's at least 16 tokens (bench.input_len 16 words per seeded prompt) and the "
            f"10000000 tokens asked (bench.output_len at {exp}:{line_of(exp, '    output_len:')}:5) make 10000016, above "
            f"the context length of 262144 tokens (max_position_embeddings 262144 in {m}/config.json on simT, the "
            f"model's own: the launch sets no context_length): SGLang refuses the request") in msg, msg


def test_a_node_directory_on_a_full_disk_is_refused(sim: SimNode, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        host_vars = {**sim.host_vars(), "specab_node_dir": str(full / "node")}
        err, out = io.StringIO(), io.StringIO()
        with redirect_stderr(err):
            rc = cli.main(["-e", str(experiment(sim, tmp_path)), "-i", str(sim.write_inventory(host_vars)),
                           "--runs-dir", str(tmp_path / "runs")], out=out)
        assert rc == 2 and (f"simT: only 1 MB free on the disk of its node directory {full}/node (specab_node_dir; "
                            f"a run's files need at least 200 MB)") in err.getvalue(), err.getvalue()
        assert not (full / "node").exists()
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
