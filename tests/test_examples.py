"""examples/ run as a user runs them (python examples/<name>.py, a fresh interpreter) and do what they
say: the NumPy MLP learns the digits, the torch recipe's loss falls (on a GPU with torch)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_every_example_is_tested():
    assert sorted(os.listdir(os.path.join(ROOT, "examples"))) == ["numpy_mlp.py", "torch_gradscaler.py"]


def test_the_numpy_mlp_learns(tmp_path):
    out = run_example("numpy_mlp.py", tmp_path)
    assert float(re.search(r"held-out accuracy ([\d.]+)%", out).group(1)) > 85, out
    losses = [float(v) for v in re.findall(r"loss ([\d.]+)", out)]
    assert len(losses) == 3 and losses[-1] < losses[0] / 2, out


@pytest.mark.gpu
def test_the_torch_recipe_learns(tmp_path):
    pytest.importorskip("torch")
    out = run_example("torch_gradscaler.py", tmp_path)
    losses = [float(v) for v in re.findall(r"step +\d+  loss ([\d.]+)", out)]
    final = float(re.search(r"final loss ([\d.]+)", out).group(1))
    assert len(losses) == 4 and final < losses[0] / 2, out
