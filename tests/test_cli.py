"""The command line: `ampc` (the console script pip installs) and `python -m ampc`, with --version."""

import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest

import ampc
from ampc.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"ampc {ampc.__version__}\n"


def test_python_dash_m_ampc_names_itself_so():
    done = subprocess.run([sys.executable, "-m", "ampc", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ampc [-h] [--version] {doctor,demo}")


def test_the_installed_console_script_runs_the_command_line():
    """pip install put an `ampc` script on the path that runs ampc.cli.main:main."""
    scripts = importlib.metadata.distribution("ampc").entry_points.select(group="console_scripts")
    assert [(s.name, s.value) for s in scripts] == [("ampc", "ampc.cli.main:main")]
    exe = shutil.which("ampc", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert exe is not None, "no `ampc` script beside this Python or on PATH"
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, f"ampc {ampc.__version__}\n"), done.stderr
    usage = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120).stdout
    assert usage.startswith("usage: ampc [-h]")
