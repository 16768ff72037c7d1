"""Plain-text checks over the C sources (msgspec's cpylint idea): mistakes the
compiler does not catch."""

import pathlib
import re
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# setup.py's folders, subfolders too, so that a file moved between them stays linted.
FOLDERS = ("src", "cpu", "kernels", "cuda")
SOURCES = sorted(p for folder in FOLDERS for suffix in (".c", ".cu") for p in ROOT.glob(f"{folder}/**/*{suffix}"))


def rel(path):
    return path.relative_to(ROOT).as_posix()


def calls(name):
    """Every call of `name` with its arguments, across lines."""
    for path in SOURCES:
        text = path.read_text()
        for m in re.finditer(rf"\b{name}\s*\(", text):
            depth, i = 0, m.end() - 1
            while i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
                if depth == 0:
                    break
            yield rel(path), text.count("\n", 0, m.start()) + 1, text[m.start():i]


def test_no_float_conversions_in_pyerr_format():
    """PyUnicode_FromFormat has no %g/%f/%e: Python 3.12 raises SystemError for them."""
    bad = [f"{f}:{line}" for name in ("PyErr_Format", "PyUnicode_FromFormat")
           for f, line, call in calls(name) if re.search(r"%[-0-9.]*[gfeGE]", call)]
    assert not bad, bad


def test_no_exit_or_abort_in_library_code():
    bad = [rel(p) for p in SOURCES if re.search(r"\b(exit|abort)\s*\(", p.read_text())]
    assert not bad, bad


def test_every_kernel_launch_is_checked():
    """Right after each <<<...>>> launch, cudaGetLastError(), directly or through
    ampc_cuda_launched() (cuda/runtime.c), which must itself call it."""
    helper = re.search(r"\nint ampc_cuda_launched\(const char \*what\)\n\{(.*?)\n\}",
                       (ROOT / "cuda" / "runtime.c").read_text(), re.S)
    assert helper and "cudaGetLastError()" in helper.group(1), "ampc_cuda_launched() must check"
    for path in (p for p in SOURCES if p.suffix == ".cu"):
        text = path.read_text()
        for m in re.finditer(r"<<<", text):
            rest = text[m.end():m.end() + 600]
            assert "cudaGetLastError()" in rest or "ampc_cuda_launched(" in rest, \
                f"{rel(path)}:{text.count(chr(10), 0, m.start()) + 1}"


def test_gil_released_and_reacquired_in_pairs():
    for path in (p for p in SOURCES if p.suffix == ".c"):
        text = path.read_text()
        assert text.count("Py_BEGIN_ALLOW_THREADS") == text.count("Py_END_ALLOW_THREADS"), rel(path)


def test_every_module_declares_its_free_threading_support():
    """Each extension module says whether it runs without the GIL (Py_mod_gil, CPython 3.13+)."""
    for path in (ROOT / "src/module.c", ROOT / "cuda/api.c"):
        slots = re.findall(r"PyModuleDef_Slot \w+\[\] = \{(.*?)\};", path.read_text(), re.S)
        assert slots and all("{Py_mod_gil, Py_MOD_GIL_USED}" in s for s in slots), path.name


@pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"), reason="needs a free-threaded CPython")
def test_a_free_threaded_build_runs_ampc_with_the_gil():
    import ampc  # noqa: F401

    assert sys._is_gil_enabled()
