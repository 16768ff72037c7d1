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


def c_files(root, suffixes):
    return sorted(p for folder in FOLDERS for suffix in suffixes for p in root.glob(f"{folder}/**/*{suffix}"))


SOURCES = c_files(ROOT, (".c", ".cu"))
# Everything the compilers read: the sources, their headers and included text.
C_TEXT_SUFFIXES = (".c", ".cu", ".h", ".cuh", ".inc")


def rel(path, root=ROOT):
    return path.relative_to(root).as_posix()


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


# A call that writes to the process's stdout or stderr (snprintf and vsnprintf write to memory).
PRINTS = re.compile(r"\b(?:std::)?(?:printf|fprintf|vprintf|vfprintf|dprintf|puts|fputs|putchar|fputc|putc|perror)"
                    r"\s*\(|\bstd::(?:cout|cerr|clog)\b")


def prints(root):
    """file:line of each print in the C, CUDA and included text under root's folders."""
    return [f"{rel(path, root)}:{text.count(chr(10), 0, m.start()) + 1}"
            for path in c_files(root, C_TEXT_SUFFIXES) for text in [path.read_text()]
            for m in PRINTS.finditer(text)]


def test_nothing_prints_from_c():
    """ampc's C hands what it has to say to Python, which prints it where the caller's sys.stderr
    goes: an error as an exception's message, AMPC_CONV_DEBUG's lines through
    _C._cuda_conv_report (cuda/conv_report.c). No C or CUDA file writes to stdout or stderr
    itself, a kernel's printf included."""
    assert not prints(ROOT), prints(ROOT)


def test_a_planted_print_is_reported(tmp_path):
    """The rule above finds a print in any of the four folders, at any depth, in any of the
    suffixes, and leaves formatting into memory alone."""
    planted = {
        "cuda/sub/x.cuh": "// a kernel\n__device__ void f() { printf(\"%d\", 1); }\n",
        "src/x.inc": "static void g(void)\n{\n    fprintf (stderr, \"no\");\n}\n",
        "kernels/x.h": "#define SAY() puts(\"no\")\n",
        "cpu/x.c": "void h(char *b) { snprintf(b, 4, \"%d\", 1); }\nvoid i(void) { perror(\"no\"); }\n",
        "src/y.c": "void j(char *b, va_list ap) { vsnprintf(b, 4, \"%d\", ap); }\n",
        "tests/z.c": "int main(void) { printf(\"tests may\"); }\n",
    }
    for name, text in planted.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert prints(tmp_path) == ["cpu/x.c:2", "cuda/sub/x.cuh:2", "kernels/x.h:1", "src/x.inc:3"]


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
