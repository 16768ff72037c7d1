"""Build ampc._C (always) and ampc._cuda (where CUDA is found).

Environment knobs:
  AMPC_CUDA=0      do not build ampc._cuda
  AMPC_CUDA=1      fail unless ampc._cuda can be built
  AMPC_CUDA_ARCH   compute capabilities to compile for, e.g. "90" or "75;80;90"
                   (default "75;80;90": CUDA 13's oldest target, Ampere, Hopper;
                   PTX of the newest is embedded for later GPUs)
  CUDA_HOME        the CUDA toolkit (else /usr/local/cuda, else nvcc on PATH)
  AMPC_DEBUG=1     -O0 -g, assertions on
  AMPC_WERROR=1    warnings are errors (CI)
  AMPC_SANITIZE=1  AddressSanitizer and UndefinedBehaviorSanitizer, float-cast-overflow included
                   (-O1 -g; .ci/sanitize runs the CPU suite on such a build)
"""

import concurrent.futures
import glob
import os
import platform
import shutil
import subprocess
import sys
import sysconfig

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("AMPC_DEBUG") == "1"
WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers"]
if os.environ.get("AMPC_WERROR") == "1":
    WARNINGS.append("-Werror")
OPT = ["-O0", "-g", "-UNDEBUG"] if DEBUG else ["-O3"]
SANITIZE = []
if os.environ.get("AMPC_SANITIZE") == "1":
    # float-cast-overflow is not part of GCC's "undefined": a double out of an integer type's range
    # converted to it (a NaN, 1e300 to int64) is undefined behaviour, and has been the bug (issue 50).
    # No recovery for either group, so that the first report ends the process and fails the run.
    SANITIZE = ["-fsanitize=address,undefined,float-cast-overflow",
                "-fno-sanitize-recover=undefined,float-cast-overflow", "-fno-omit-frame-pointer"]
    OPT = ["-O1", "-g", "-UNDEBUG"]
# A multiply and an add stay two roundings: the optimizer steps (kernels/optim_math.h) give the
# same bits on the CPU and the GPU only if neither compiler fuses them. No trapping maths: the
# kernels run with every exception masked (cpu/fpenv.h), so the compiler may compute both sides
# of a select, which is what lets it vectorise the optimizer loops; and no errno from sqrt,
# which would make each square root a call. Results are unchanged.
FP = ["-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno"]


def compiler_is_gcc():
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "").split()
    return bool(cc) and "gcc" in os.path.basename(cc[0])


# The Adam loops (cpu/optim_cpu.c) test their options (maximize, the weight decay's kind) inside
# the loop; GCC vectorises them only once it has unswitched those tests out, which its default
# size limit forbids for a loop that long (measured: scalar code, AdamW at half the memory speed).
if compiler_is_gcc():
    FP.append("--param=max-unswitch-insns=200")
# The folders each extension module is built from (their files, subfolders too): src/ (the
# Python-facing C), cpu/ (the CPU kernels), kernels/ (the plain-C contract both backends share)
# and cuda/ (ampc._cuda).
FOLDERS = {"ampc._C": ("src", "cpu", "kernels"), "ampc._cuda": ("cuda",)}
SOURCE_SUFFIXES = {"ampc._C": (".c",), "ampc._cuda": (".c", ".cu")}
HEADER_SUFFIXES = (".h", ".inc", ".cuh", ".def")
# Per-file nvcc options, by path. A key that names no source of ampc._cuda fails the build (below):
# renamed silently, cuda/optim.cu would lose --fmad=false and its bit equality with the CPU.
NVCC_FILE_FLAGS = {"cuda/optim.cu": ["--fmad=false"]}


def files(folders, suffixes):
    """The files under `folders` ending in one of `suffixes`, as sorted paths relative to the root."""
    found = []
    for folder in folders:
        for parent, dirs, names in os.walk(os.path.join(ROOT, folder)):
            dirs.sort()
            found += [os.path.relpath(os.path.join(parent, f), ROOT).replace(os.sep, "/")
                      for f in names if f.endswith(suffixes)]
    return sorted(found)


def sources(module):
    return files(FOLDERS[module], SOURCE_SUFFIXES[module])


def headers():
    """Every header of both modules: each Extension's depends, and what nvcc() checks a .cu
    object against (a header it does not list leaves stale objects behind)."""
    return [os.path.join(ROOT, p) for p in files([f for fs in FOLDERS.values() for f in fs], HEADER_SUFFIXES)]


_unknown = sorted(set(NVCC_FILE_FLAGS) - set(sources("ampc._cuda")))
if _unknown:
    sys.exit(f"setup.py: NVCC_FILE_FLAGS names {_unknown}, which are not sources of ampc._cuda: "
             "move the flags to the file's new path")


def find_cuda():
    """The CUDA toolkit root, or None."""
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for home in candidates:
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return home
    return None


def cuda_layout(home):
    """Include and library folders holding what ampc._cuda needs, or a reason it can't be built.

    cuDNN may come with the toolkit or from the distribution's packages, which
    Debian and Ubuntu put under the multiarch folders."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    include_dirs = [
        d for d in (os.path.join(home, "include"), "/usr/include", f"/usr/include/{multiarch}") if os.path.isdir(d)
    ]
    library_dirs = [
        d
        for d in (os.path.join(home, "lib64"), os.path.join(home, "lib"), f"/usr/lib/{multiarch}")
        if os.path.isdir(d)
    ]
    needs = {
        "cuda_runtime.h": include_dirs,
        "cublasLt.h": include_dirs,
        "cudnn.h": include_dirs,
        "libcudart_static.a": library_dirs,
        "libcublasLt.so": library_dirs,
        "libcudnn.so": library_dirs,
    }
    for name, dirs in needs.items():
        if not any(os.path.exists(os.path.join(d, name)) for d in dirs):
            return None, None, f"{name} not found under {dirs}"
    return include_dirs, library_dirs, None


def gencode_flags():
    archs = [a.strip() for a in os.environ.get("AMPC_CUDA_ARCH", "75;80;90").replace(",", ";").split(";")]
    archs = [a for a in archs if a]
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    flags += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
    return flags


class BuildExt(build_ext):
    """Compiles .cu sources with nvcc; everything else goes through setuptools as usual."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # the C sources too, one a core (pip install passes no -j)
            self.parallel = os.cpu_count() or 1

    def run(self):
        if not any(ext.name == "ampc._cuda" for ext in self.extensions):
            # An ampc._cuda left by an earlier build of this tree must not ship (the source tree's
            # only when building in place: .ci/sanitize builds elsewhere and must leave it alone).
            folders = {os.path.join(self.build_lib, "ampc")} | ({os.path.join(ROOT, "ampc")} if self.inplace else set())
            for folder in folders:
                for stale in glob.glob(os.path.join(folder, "_cuda.*")):
                    os.remove(stale)
        super().run()

    def build_extension(self, ext):
        cu = [s for s in ext.sources if s.endswith(".cu")]
        if cu:
            ext.sources = [s for s in ext.sources if not s.endswith(".cu")]
            # nvcc takes most of the build and compiles one file on one core: run the files at once.
            with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                objects = list(pool.map(lambda src: self.nvcc(src, ext), cu))
            ext.extra_objects = list(ext.extra_objects) + objects
            # setuptools relinks only when a source or dependency is newer than the library: with the
            # .cu files out of the sources, a change to one alone compiled it and left the old code linked
            ext.depends = list(ext.depends) + cu
        super().build_extension(ext)

    def nvcc(self, src, ext):
        obj = os.path.join(self.build_temp, os.path.splitext(src)[0] + ".o")
        deps = [os.path.join(ROOT, src)] + headers()
        if os.path.exists(obj) and not self.force and all(os.path.getmtime(obj) >= os.path.getmtime(d) for d in deps):
            return obj
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        cmd = [os.path.join(CUDA_HOME, "bin", "nvcc"), "-c", src, "-o", obj, "-std=c++17"]
        cmd += ["-O0", "-g", "-G"] if DEBUG else ["-O3", "-lineinfo"]
        cmd += ["-Xcompiler", "-fPIC," + ",".join(WARNINGS), "-Xfatbin=-compress-all"]
        cmd += ["--threads", "0"] + gencode_flags() + NVCC_FILE_FLAGS.get(src, [])
        if "-Werror" in WARNINGS:
            cmd += ["-Werror", "all-warnings"]
        cmd += [f"-I{d}" for d in ext.include_dirs]
        print(" ".join(cmd))
        subprocess.check_call(cmd, cwd=ROOT)
        return obj


core = Extension(
    "ampc._C",
    sources=sources("ampc._C"),
    # "." (the root): an include written with its folder ("kernels/dtypes.h") resolves from anywhere.
    # Neither module sees the other's folder: they meet only in kernels/backend.h's table.
    include_dirs=["src", ".", numpy.get_include()],
    extra_compile_args=["-std=gnu11"] + WARNINGS + OPT + FP + SANITIZE,
    extra_link_args=SANITIZE,
    depends=headers(),
    libraries=["pthread"],
)
extensions = [core]

CUDA_HOME = None
want_cuda = os.environ.get("AMPC_CUDA", "").strip()
if want_cuda != "0":
    CUDA_HOME = find_cuda()
    why_not = "nvcc not found (set CUDA_HOME)" if CUDA_HOME is None else None
    if CUDA_HOME is not None:
        cuda_includes, cuda_libs, why_not = cuda_layout(CUDA_HOME)
    if why_not is None:
        extensions.append(
            Extension(
                "ampc._cuda",
                sources=sources("ampc._cuda"),
                include_dirs=["cuda", "."] + cuda_includes,
                library_dirs=cuda_libs,
                runtime_library_dirs=cuda_libs,
                libraries=["cudart_static", "cublasLt", "cudnn", "rt", "dl", "pthread"],
                extra_compile_args=["-std=gnu11"] + WARNINGS + OPT + FP,
                depends=headers(),
            )
        )
    elif want_cuda == "1":
        sys.exit(f"AMPC_CUDA=1 but ampc._cuda cannot be built: {why_not}")
    else:
        print(f"ampc: building without CUDA ({why_not})")

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
