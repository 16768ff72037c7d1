"""The README's Python blocks run as written, each in a fresh interpreter: a user copies them whole.

A block fenced ```python runs here; one fenced ```python gpu needs a CUDA GPU and torch (a gpu test:
skipped without one, a failure under --require-gpu). The install commands (```sh) are what CI itself
runs (.ci/run), so they are not run again here.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```$", re.M | re.S)


def blocks(path):
    """(tags, code, line) of each ```python block of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [(set(m.group(1).split()), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


README_BLOCKS = blocks(os.path.join(ROOT, "README.md"))


def test_the_readme_has_its_examples_and_stays_short():
    """A torch block, a NumPy block, and at most 250 lines (lab notes go to benchmarks/NOTES.md)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 250
    assert [sorted(tags) for tags, _, _ in README_BLOCKS] == [["gpu"], []]
    assert not [tags for tags, _, _ in README_BLOCKS if tags - {"gpu"}], "unknown tag"


def test_the_block_finder_sees_tags_and_lines(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n```python\nx = 1\n```\n\n```python gpu\ny = 2\n```\n```sh\nls\n```\n")
    assert blocks(page) == [(set(), "x = 1\n", 2), ({"gpu"}, "y = 2\n", 6)]


def _run(code, tmp_path):
    """Run code in a new interpreter, in an empty folder, with this checkout's ampc first."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.parametrize("code", [code for tags, code, _ in README_BLOCKS if not tags],
                         ids=[f"README.md:{line}" for tags, _, line in README_BLOCKS if not tags])
def test_a_cpu_block_runs(code, tmp_path):
    out = _run(code, tmp_path)
    if "held-out accuracy" in code:  # the NumPy loop trains, not merely runs
        accuracy = float(re.search(r"held-out accuracy ([\d.]+)%", out).group(1))
        assert accuracy > 80, out


@pytest.mark.gpu
@pytest.mark.parametrize("code", [code for tags, code, _ in README_BLOCKS if "gpu" in tags],
                         ids=[f"README.md:{line}" for tags, _, line in README_BLOCKS if "gpu" in tags])
def test_a_gpu_block_runs(code, tmp_path):
    pytest.importorskip("torch")
    out = _run(code, tmp_path)
    loss = float(re.search(r"loss ([\d.]+|nan|inf)", out).group(1))
    assert loss == loss and loss < 10, out  # finite: the scaler kept the fp16 run alive
