"""ampc.distributed on torch.distributed: gloo on the CPU (one process, and two launched with torch's
environment variables), NCCL with one GPU rank."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ampc
from ampc import distributed as dist

torch = pytest.importorskip("torch")
WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


@pytest.fixture
def alone():
    group = dist.init_process_group("gloo-via-torch")
    yield group
    dist.destroy_process_group()


def test_one_process_gloo(alone):
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1) and alone.backend == "gloo"
    for dtype in (np.float32, np.float64, ampc.bfloat16):
        a = (np.arange(5) - 2).astype(dtype)
        before = a.copy()
        assert dist.all_reduce(a, "max") is a
        np.testing.assert_array_equal(a, before)
    avg = np.full(3, 4.0, np.float32)
    dist.all_reduce(avg, "avg")
    np.testing.assert_array_equal(avg, np.full(3, 4.0, np.float32))
    dist.broadcast(avg, 0)
    dist.barrier()


def launch(case, ranks=2):
    root = os.path.dirname(os.path.dirname(ampc.__file__))
    port = str(dist._free_port())
    procs = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   AMPC_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        procs.append(subprocess.Popen([sys.executable, WORKER, case, "60", "gloo-via-torch"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=180))
    finally:  # a rank that failed leaves none running (nor its pipes open) behind it
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    results = []
    for p, (out, err) in zip(procs, outputs):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert p.returncode == 0 and lines, out + err
        results.append(json.loads(lines[0][7:]))
    return sorted(results, key=lambda r: r["rank"])


def test_two_processes_gloo_agree():
    results = launch("collectives")
    for r in results:
        assert r["f32_sum"] == [1.0, 3.0, 5.0, 7.0] and r["bf16_max"] == [1.0, 2.0, 3.0, 4.0]
        assert r["avg"] == [0.5] * 3 and r["broadcast"] == [8.0] * 5
    ddp = launch("ddp")
    assert ddp[0]["checksum"] == ddp[1]["checksum"] and ddp[0]["state"] == ddp[1]["state"]
    assert ddp[0]["stats"]["skipped_steps"] >= 1
    sharded = launch("sharded")
    assert sharded[0]["stats"] == sharded[1]["stats"] and sharded[0]["stats"]["skipped_steps"] == 1


@pytest.mark.gpu
def test_one_gpu_nccl():
    """The NCCL path with one rank: ampc arrays in ampc's GPU pool reduced in place, DataParallel
    over a model on the GPU, a GradScaler step."""
    group = dist.init_process_group("nccl")
    try:
        assert group.backend == "nccl"
        a = ampc._C._to_device(np.arange(6, dtype=np.float32), 0)
        dist.all_reduce(a, "sum")
        np.testing.assert_array_equal(np.asarray(ampc._C._to_device(a, -1)), np.arange(6, dtype=np.float32))
        ampc.manual_seed(0)
        model = dist.DataParallel(ampc.nn.Sequential(ampc.nn.Linear(8, 4)).to("cuda"))
        opt = ampc.optim.SGD(list(model.parameters()), lr=0.1)
        scaler = ampc.GradScaler("cuda")
        x = ampc._C._to_device(np.ones((2, 8), np.float32), 0)
        y = ampc._C._to_device(np.array([1, 2]), 0)
        with ampc.autocast("cuda"):
            loss = ampc.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert np.isfinite(float(loss))
    finally:
        dist.destroy_process_group()


def torchrun(ranks, *arguments):
    """python -m ampc demo --distributed arguments under torchrun (standalone: its own rendezvous):
    its output, once it returned 0."""
    root = os.path.dirname(os.path.dirname(ampc.__file__))
    env = dict(os.environ, AMPC_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NCCL_NVLS_ENABLE="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                          "-m", "ampc", "demo", "--distributed", *arguments],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def torchrun_demo(ranks, *extra):
    """The MLP's distributed demo under torchrun: its table's ranks agree."""
    run = torchrun(ranks, "--epochs", "1", *extra)
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0].strip() for r in rows] == ["rank"] + [str(r) for r in range(ranks)], run.stdout
    assert {tuple(c.strip() for c in r[1:]) for r in rows[1:]} == {tuple(c.strip() for c in rows[1][1:])}
    assert rows[1][2].strip() == "1"  # the one injected overflow, skipped on every rank
    assert "ranks agree: yes" in run.stdout
    return run.stdout


def test_the_distributed_demo_under_torchrun_on_the_cpu():
    assert "over gloo" in torchrun_demo(2, "--device", "cpu")


@pytest.mark.gpu
def test_the_distributed_demo_under_torchrun_on_a_gpu():
    assert "over NCCL" in torchrun_demo(1)


@pytest.mark.gpu
# its kernels are checked under those tools in test_attention_gpu's GPT-2 demo test and this file's other tests
@pytest.mark.outlasts_racecheck_and_initcheck
def test_the_distributed_gpt2_demo_against_torch_ddp_on_a_gpu():
    """--model gpt2 --compare-torch under torchrun on one GPU: ampc's DataParallel and torch's
    DistributedDataParallel over NCCL, each alone and then with the world (one rank here), the inf at
    the first step skipped by both, the scale halved once per skipped step."""
    out = torchrun(1, "--model", "gpt2", "--batch-size", "1", "--seq-len", "64", "--warmup", "1", "--steps", "2",
                   "--compare-torch").stdout
    assert "over NCCL" in out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith(("| ampc ", "| torch DDP "))]
    assert [r[:2] for r in rows] == [["ampc", "1"], ["ampc", "1"], ["torch DDP", "1"], ["torch DDP", "1"]], out
    for single, together in (rows[0], rows[1]), (rows[2], rows[3]):
        assert float(single[2]) > 0 and float(together[2]) > 0
        skipped, scale = int(together[5]), float(together[6])
        assert skipped >= 1 and scale == 65536.0 / 2**skipped
        assert together[7] == "yes"
    assert "torch's step time / ampc's" in out
