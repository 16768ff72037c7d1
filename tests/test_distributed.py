"""ampc.distributed over MPI on the CPU: each test launches tests/distributed_worker.py with
`mpirun -n 2` and `-n 3` (an odd count) and compares what the ranks report."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ampc

pytest.importorskip("mpi4py")
# Open MPI's wheel puts mpirun beside the interpreter, which need not be on PATH
_HERE = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
MPIRUN = shutil.which("mpirun", path=_HERE) or shutil.which("mpiexec", path=_HERE)
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


def launch(case, ranks, *extra, timeout=120, command=None):
    root = os.path.dirname(os.path.dirname(ampc.__file__))  # the workers import the ampc these tests do
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", AMPC_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    command = command or [WORKER, case, *extra]
    run = subprocess.run([MPIRUN, "-n", str(ranks), "--oversubscribe", sys.executable, *command],
                         capture_output=True, text=True, timeout=timeout, env=env)
    if case is None:
        return run
    results = [json.loads(line[7:]) for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == ranks, f"{case}: {len(results)} of {ranks} ranks answered\n{run.stdout}\n{run.stderr}"
    return sorted(results, key=lambda r: r["rank"]), run


@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives(ranks):
    results, _ = launch("collectives", ranks)
    base = np.arange(4, dtype=np.float64)
    for r in results:
        for name in ("f32", "f64", "bf16", "i64"):
            assert r[f"{name}_sum"] == (ranks * base + sum(range(ranks))).tolist()
            assert r[f"{name}_max"] == (base + ranks - 1).tolist()
            assert r[f"{name}_min"] == base.tolist()
        assert r["avg"] == [sum(range(ranks)) / ranks] * 3
        assert r["broadcast"] == [ranks - 1 + 7.0] * 5


@pytest.mark.parametrize("ranks", [2, 3])
def test_data_parallel_ranks_agree_and_skip_together(ranks):
    results, _ = launch("ddp", ranks)
    first = results[0]
    for r in results:
        assert r["checksum"] == first["checksum"]  # the same parameters, bit for bit
        assert r["state"] == first["state"] and r["stats"] == first["stats"]
        assert r["stats"]["skipped_steps"] >= 1  # the inf on rank 1 alone made every rank skip
        assert r["keys"] == ["module.0.weight", "module.0.bias"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_scaler_agrees_on_found_inf(ranks):
    results, _ = launch("sharded", ranks)
    for r in results:
        assert r["stats"] == results[0]["stats"]
        assert r["stats"]["skipped_steps"] == 1 and r["stats"]["steps"] == 4
    if ranks == 3:
        assert results[2]["values"] == []  # the rank with no shard took part


@pytest.mark.parametrize("ranks", [2, 3])
def test_sharded_scaler_hysteresis_and_bounds_act_on_every_rank(ranks):
    results, _ = launch("hysteresis", ranks)
    for r in results:
        assert r["scales"] == results[0]["scales"] and r["stats"] == results[0]["stats"]
    scales = results[0]["scales"]
    assert scales[0] == 512.0 and scales[1] == 512.0  # grew, then the first overflow is absorbed
    assert scales[2] == 256.0  # the second in a row backs off
    assert max(scales) == 1024.0 and min(scales) >= 64.0  # the bounds
    assert results[0]["stats"]["skipped_steps"] == 3


def test_a_rank_that_leaves_is_an_error_not_a_hang():
    results, _ = launch("timeout", 2, "3")
    assert results[1]["left"]
    assert "did not complete within 3 s on rank 0 of 2" in results[0]["error"]


def test_the_distributed_demo():
    run = launch(None, 3, command=["-m", "ampc", "demo", "--distributed", "--epochs", "1"])
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0].strip() for r in rows] == ["rank", "0", "1", "2"]
    assert {tuple(c.strip() for c in r[1:]) for r in rows[1:]} == {tuple(c.strip() for c in rows[1][1:])}
    assert rows[1][2].strip() == "1"  # the one injected overflow, skipped on every rank
    assert "ranks agree: yes" in run.stdout


def test_the_distributed_demo_of_gpt2():
    """--model gpt2 under mpirun: GPT-2 small data-parallel on one rank, then two, the second rank's
    loss an inf at the first step: both ranks skip it and end with the same parameters (the table's
    last column and the exit status), the scale halved once per skipped step."""
    run = launch(None, 2, command=["-m", "ampc", "demo", "--distributed", "--model", "gpt2", "--batch-size", "1",
                                   "--seq-len", "8", "--warmup", "0", "--steps", "1"], timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in run.stdout.splitlines()
            if line.startswith("| ampc ")]
    assert [r[:2] for r in rows] == [["ampc", "1"], ["ampc", "2"]], run.stdout
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
    assert float(rows[1][4]) == pytest.approx(float(rows[0][2]) / float(rows[1][2]), rel=1e-2)
    skipped, scale = int(rows[1][5]), float(rows[1][6])
    assert skipped >= 1 and scale == 65536.0 / 2**skipped
    assert rows[1][7] == "yes"
