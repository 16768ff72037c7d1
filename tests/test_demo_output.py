"""The demo's plot (matplotlib) and progress (tqdm): every run visible and named, a run that broke
marked, the loss scale on its own axis; the bar's rate; the plain line without tqdm."""

import io
import math

import pytest

from ampc.cli import plot, progress
from ampc.cli.main import main

matplotlib = pytest.importorskip("matplotlib")


def run(name, losses, scales=None):
    return {"name": name, "losses": losses, "scales": scales or [1.0] * len(losses),
            "scale": None if scales is None else scales[-1]}


def svg_of(results, tmp_path):
    """The plot as SVG with its text kept as text, to read the labels back."""
    path = tmp_path / "runs.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        plot.save_training_plot(str(path), results)
    return path.read_text()


def test_every_run_is_named_and_a_broken_run_is_marked(tmp_path):
    same = [2.0, 1.5, 1.0, 0.8, 0.7]
    text = svg_of([run("fp32", same), run("AMP bf16", list(same)),
                   run("AMP fp16", same, scales=[65536.0, 65536.0, 32768.0, 32768.0, 32768.0]),
                   run("torch fp32", [2.0, 1.4, math.nan, math.nan, math.nan]),
                   run("torch fp16", [2.0, math.inf, 1.0, 0.9, 0.8], scales=[4.0, 2.0, 2.0, 2.0, 2.0])], tmp_path)
    for label in ("fp32", "AMP bf16", "AMP fp16", "torch fp32 (NaN from step 2 on)",
                  "torch fp16 (NaN at step 1, trained on)", "loss scale", "step"):
        assert f">{label}<" in text, label
    assert text.count('stroke-dasharray') >= 2  # coinciding runs differ in dash, not color alone


def test_no_scaled_run_says_so(tmp_path):
    assert ">no run with a GradScaler<" in svg_of([run("fp32", [1.0, 0.5])], tmp_path)


def test_first_nonfinite():
    assert plot.first_nonfinite([1.0, 2.0]) is None
    assert plot.first_nonfinite([1.0, math.inf, math.nan]) == 1


def test_the_plot_is_a_png_from_the_command(tmp_path):
    path = tmp_path / "runs.png"
    assert main(["demo", "--epochs", "1", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_plot_is_refused_before_training(monkeypatch, capsys):
    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    with pytest.raises(SystemExit):
        main(["demo", "--plot", "runs.png"])
    assert "pip install 'ampc[demo]'" in capsys.readouterr().err


def test_the_bar_shows_rate_and_loss():
    pytest.importorskip("tqdm")
    stream = io.StringIO()
    bar = progress.Progress("AMP fp16", 10, stream=stream)
    for done in range(1, 11):
        bar.show(done, 1.0 / done)
    out = stream.getvalue()
    assert "AMP fp16" in out and "10/10" in out and "step/s" in out and "loss 0.1000" in out


def test_without_tqdm_one_line_at_the_end(monkeypatch):
    monkeypatch.setattr(progress, "tqdm", None)
    stream = io.StringIO()
    bar = progress.Progress("fp32", 3, stream=stream)
    bar.show(1, 2.0)
    assert stream.getvalue() == ""
    bar.show(3, 0.5)
    line = stream.getvalue()
    assert line.startswith("fp32") and "3 steps in" in line and line.endswith("loss 0.5000\n")
