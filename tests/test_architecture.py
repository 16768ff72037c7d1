"""The layers of ampc and the directions they may depend in, checked from the source text alone:
`re`, `ast` and `os` read the tree; this file imports no part of ampc and needs no build.

C, the two extension modules (issue 51's target shape):
    kernels/  the plain-C contract both backends fill: dtypes, op and optimizer descriptors, the
              shared math; it includes only kernels/
    cpu/      the CPU backend: cpu/ and kernels/
    cuda/     the CUDA backend (ampc._cuda): cuda/ and kernels/
    src/      the Python-facing C (module, types, argument parsing, dispatch): src/ and kernels/;
              cpu/ only through a listed include, until the backend table replaces them
Python, one direction: ampc._C <- core (amp, optim, random, ...) <- autograd <- nn <- models <- the
CLI and demo. What keeps it one direction is checked: no import reaches a higher layer, no cycle
among module-level imports, no import of an ampc module inside a function (the usual way to dodge a
cycle), no module that rewrites its own globals.

Why: an op, a dtype or a backend then lives in one place. A backend builds against kernels/ alone,
src/ can change without a backend seeing it, and a reader can take the tree bottom up.

The tree of today breaks these rules in known places (issue 51, /work/notes/issue51_plan.md
sections 1 and 2). Each break is a row of an ALLOWED list below. A new break fails the test, and so
does a row that no longer occurs (a ratchet): each refactoring step deletes the rows it removes.
`python tests/test_architecture.py` prints the lists as the tree stands, in the form written here.
"""

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------------------
# The lists. Rows are sorted, one per line, no comments inside: the script prints them this way.
# ---------------------------------------------------------------------------------------------

# (including file, included file): none. src/ reaches both backends through kernels/backend.h's
# table alone, and neither backend includes src/.
ALLOWED_INCLUDES = [
]

# C files that call each other's functions, around a loop (src/ had 13 in one at 10bbb44). Left:
# src/array.c and src/dlpack.c, by design: an imported DLPack tensor is owned by an ampc.Array
# (dlpack.c -> array.c) and an ampc.Array exports itself through DLPack (array.c -> dlpack.c).
# cuda/conv.c and conv_graph.c: the graph API's debug lines name the plan by conv.c's key text.
ALLOWED_C_CALL_CYCLES = [
    ("cuda/conv.c", "cuda/conv_graph.c"),
    ("src/array.c", "src/dlpack.c"),
]

# Strongly connected components of the module-level import graph, each as its sorted modules.
# None is left: nn/functional.py re-exports the tape's ops, which _differentiable builds from the
# bare ones in _bare_ops.py and the other op modules without importing functional (plan step P4).
ALLOWED_CYCLES = [
]

# (importing module, enclosing function, imported ampc module).
ALLOWED_FUNCTION_IMPORTS = [
]

# Modules that assign to their own globals(). None is left: functional.py names each op it
# publishes (plan step P4).
ALLOWED_GLOBALS_REWRITES = [
]

# (importing module, imported module) where the import goes up the Python layers (PYTHON_LAYERS).
ALLOWED_UPWARD_IMPORTS = [
]

# ---------------------------------------------------------------------------------------------
# The build, as far as the checks need it (test_the_model_matches_setup_py holds them to it).
# ---------------------------------------------------------------------------------------------

# setup.py's FOLDERS: the folders each extension module is built from.
MODULE_FOLDERS = {"ampc._C": ("src", "cpu", "kernels"), "ampc._cuda": ("cuda",)}
C_FOLDERS = tuple(f for folders in MODULE_FOLDERS.values() for f in folders)
C_SUFFIXES = (".c", ".h", ".cu", ".cuh", ".inc", ".def")
# A quoted include is looked for beside the including file, then in its module's include_dirs
# (setup.py's) in their order: the module's own folder, then the root, where an include written with
# its folder ("kernels/dtypes.h") resolves. Neither module has the other's folder on its path.
INCLUDE_DIRS = {"ampc._C": ("src", "."), "ampc._cuda": ("cuda", ".")}
# Each layer and the layers it may include.
MAY_INCLUDE = {
    "kernels": {"kernels"},
    "cpu": {"cpu", "kernels"},
    "cuda": {"cuda", "kernels"},
    "src": {"src", "kernels"},
}

PACKAGE = "ampc"
EXTENSIONS = ("ampc._C", "ampc._cuda")  # modules built from C: they import no Python module
# The command line's entry module loads each command's modules only when that command runs, by design
# (ampc/__main__.py is a shim that imports it at its top).
LAZY_BY_RULE = ("ampc.cli.main",)

# The Python layers above the core, lowest first, each by its modules' prefixes: a module imports
# from its own layer and those below it. The core is every module not named here (amp, optim,
# random, _interop, ...), just above ampc._C; the package's __init__ imports them all by design.
PYTHON_LAYERS = (
    ("autograd", ("ampc.autograd",)),
    ("nn", ("ampc.nn",)),
    ("models", ("ampc.models", "ampc.distributed")),
    ("cli", ("ampc.cli", "ampc.__main__")),
)


# ---------------------------------------------------------------------------------------------
# C: the include graph
# ---------------------------------------------------------------------------------------------

def c_files(root):
    """Every C, CUDA and included-text file under the layer folders, as a path relative to root."""
    found = []
    for folder in C_FOLDERS:
        for parent, dirs, files in os.walk(os.path.join(root, folder)):
            dirs.sort()
            found += [os.path.relpath(os.path.join(parent, f), root).replace(os.sep, "/")
                      for f in sorted(files) if f.endswith(C_SUFFIXES)]
    return found


# String and character literals are matched so that a "/*" inside one starts no comment.
_C_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def quoted_includes(text):
    """The names of the `#include "..."` lines outside comments, with their line numbers."""
    def blank(m):
        token = m.group()
        return token if token[0] in "\"'" else "\n" * token.count("\n")

    code = _C_TOKENS.sub(blank, text)
    return [(code.count("\n", 0, m.start()) + 1, m.group(1)) for m in _INCLUDE.finditer(code)]


def module_of(path):
    """The extension module a C file (a path from the root) is built into."""
    return next(m for m, folders in MODULE_FOLDERS.items() if path.split("/")[0] in folders)


def resolve(root, including, name):
    """The file an include names, as the compiler finds it, relative to root; None if none."""
    for folder in (os.path.dirname(including), *INCLUDE_DIRS[module_of(including)]):
        path = os.path.normpath(os.path.join(folder, name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, path)):
            return path
    return None


def include_edges(root):
    """(including, included or None, name, line) for every quoted include of the C files."""
    edges = []
    for path in c_files(root):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            text = f.read()
        edges += [(path, resolve(root, path, name), name, line) for line, name in quoted_includes(text)]
    return edges


def layer(path):
    return path.split("/")[0]


def include_violations(root):
    """The (including, included) pairs whose direction the layers forbid, sorted."""
    return sorted({(src, dst) for src, dst, _, _ in include_edges(root)
                   if dst is not None and layer(dst) not in MAY_INCLUDE[layer(src)]})


# ---------------------------------------------------------------------------------------------
# C: the call graph between files
# ---------------------------------------------------------------------------------------------

# A function definition that is not static: its return type starts a line, its body follows the
# parameters (which may span lines). Prototypes end in ";" and are not matched. Only ampc_ names
# count: every function ampc shares between files has one (C has one namespace), where a C++ file's
# member functions and anonymous namespaces reuse short names (load, store, launch) file by file.
_C_DEFINITION = re.compile(r'^(?!static\b)[A-Za-z_][\w \t*"]*?\b([A-Za-z_]\w*)\s*\([^;{}()]*(?:\([^()]*\)[^;{}()]*)*\)\s*\{', re.M)


def c_code(text):
    """The text with its comments blanked (line numbers kept), strings and characters left."""
    return _C_TOKENS.sub(lambda m: m.group() if m.group()[0] in "\"'" else "\n" * m.group().count("\n"), text)


def c_call_edges(root):
    """{file: the other files whose non-static functions it names} over the .c and .cu files."""
    codes = {}
    for path in c_files(root):
        if path.endswith((".c", ".cu")):
            with open(os.path.join(root, path), encoding="utf-8") as f:
                codes[path] = c_code(f.read())
    defined, twice = {}, set()
    for path, code in codes.items():
        for name in {m.group(1) for m in _C_DEFINITION.finditer(code) if m.group(1).startswith("ampc_")}:
            if name in defined:
                twice.add(name)
            defined.setdefault(name, path)
    for name in twice:  # file-local in each (a .cu's anonymous namespace): the linker would refuse two
        del defined[name]
    return {path: {defined[name] for name in set(re.findall(r"\b[A-Za-z_]\w*\b", code))
                   if defined.get(name, path) != path}
            for path, code in codes.items()}


def c_call_cycles(root):
    """Files that call each other, directly or around a loop: Tarjan's components."""
    return strongly_connected(c_call_edges(root))


# ---------------------------------------------------------------------------------------------
# Python: the import graph of the package
# ---------------------------------------------------------------------------------------------

def python_modules(root):
    """{module name: path relative to root} for every .py file of the package."""
    modules = {}
    for parent, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.relpath(os.path.join(parent, f), root).replace(os.sep, "/")
                parts = path[:-len(".py")].split("/")
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


class _ImportFinder(ast.NodeVisitor):
    """Each import of a package module in one file: (enclosing function or None, target).
    None means module level: the code that runs on import, class bodies included. An import names
    its module only; the packages above it run their __init__ first, which the graph leaves out
    (ampc/__init__.py imports the whole package by design)."""

    def __init__(self, module, is_package, known):
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.scope, self.depth, self.found = [], 0, []

    def _enter(self, node, is_function):
        self.scope.append(node.name)
        self.depth += is_function
        self.generic_visit(node)
        self.depth -= is_function
        self.scope.pop()

    def visit_FunctionDef(self, node):
        self._enter(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self._enter(node, False)

    def _add(self, name):
        while name not in self.known and "." in name:
            name = name.rpartition(".")[0]  # a name inside a module: the edge goes to the module
        if name in self.known:
            self.found.append((".".join(self.scope) if self.depth else None, name))

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] == PACKAGE:
                self._add(alias.name)

    def visit_ImportFrom(self, node):
        if node.level:
            base = self.package.rsplit(".", node.level - 1)[0] if node.level > 1 else self.package
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module
        if base.split(".")[0] != PACKAGE:
            return
        for alias in node.names:
            sub = f"{base}.{alias.name}"  # `from ampc.nn import functional` names a module
            self._add(sub if sub in self.known else base)


def python_imports(root):
    """(importer, enclosing function or None, imported module) for the whole package."""
    modules = python_modules(root)
    known = set(modules) | set(EXTENSIONS)
    imports = []
    for module, path in modules.items():
        with open(os.path.join(root, path), encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        finder = _ImportFinder(module, path.endswith("__init__.py"), known)
        finder.visit(tree)
        imports += [(module, *row) for row in finder.found]
    return imports


def strongly_connected(graph):
    """Tarjan's components of {node: set of nodes}, each with more than one node, sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def import_cycles(root):
    """The cycles among module-level imports, as their components' sorted module names."""
    graph = {}
    for importer, function, target in python_imports(root):
        if function is None and target != importer:
            graph.setdefault(importer, set()).add(target)
    return strongly_connected(graph)


def function_imports(root):
    """(importer, function, imported module) for the imports of ampc modules inside a function.
    Other packages are not looked at: importing an optional dependency (torch, matplotlib, mpi4py)
    where it is needed is what keeps it optional."""
    return sorted({row for row in python_imports(root) if row[1] is not None and row[0] not in LAZY_BY_RULE})


def python_layer(module):
    """The module's place in PYTHON_LAYERS: 0 for the core, 1 for autograd, and so on up."""
    place = 0
    for rank, (_, prefixes) in enumerate(PYTHON_LAYERS, 1):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            place = rank
    return place


def upward_imports(root):
    """(importer, imported module) for the imports, at any depth, that reach a higher layer."""
    return sorted({(importer, target) for importer, _, target in python_imports(root)
                   if importer != PACKAGE and python_layer(target) > python_layer(importer)})


def rewrites_globals(tree):
    """Whether code calls a method of globals() that changes it (update, setdefault, pop, ...) or
    assigns or deletes an item of it. Reading it (globals().items()) is fine."""
    def is_globals(node):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "globals"

    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and is_globals(node.value)
                and node.attr in ("update", "setdefault", "pop", "popitem", "clear", "__setitem__")):
            return True
        if isinstance(node, ast.Subscript) and is_globals(node.value) and not isinstance(node.ctx, ast.Load):
            return True
    return False


def globals_rewrites(root):
    """The modules that rewrite their own globals, sorted."""
    found = []
    for module, path in sorted(python_modules(root).items()):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            if rewrites_globals(ast.parse(f.read(), path)):
                found.append(module)
    return found


# ---------------------------------------------------------------------------------------------
# The checks: each list against what the tree holds now
# ---------------------------------------------------------------------------------------------

LISTS = {
    "ALLOWED_INCLUDES": (include_violations, "an include must go down or sideways: "
                         + ", ".join(f"{k}/ -> {'|'.join(sorted(v))}/" for k, v in MAY_INCLUDE.items())),
    "ALLOWED_C_CALL_CYCLES": (c_call_cycles, "the C files' calls must form no cycle (a file's helpers "
                              "go into a file below both)"),
    "ALLOWED_CYCLES": (import_cycles, "module-level imports must form no cycle"),
    "ALLOWED_FUNCTION_IMPORTS": (function_imports, "an ampc module is imported at the top of a module, "
                                 "not inside a function (the CLI excepted)"),
    "ALLOWED_GLOBALS_REWRITES": (globals_rewrites, "no module rewrites its own globals()"),
    "ALLOWED_UPWARD_IMPORTS": (upward_imports, "imports go down the layers: core <- "
                               + " <- ".join(name for name, _ in PYTHON_LAYERS)),
}


def current(root=ROOT):
    """{list name: its rows as the tree at root stands}."""
    return {name: find(root) for name, (find, _) in LISTS.items()}


def compare(found, allowed):
    """(rows found but not allowed, rows allowed but no longer found), each sorted."""
    return sorted(set(found) - set(allowed)), sorted(set(allowed) - set(found))


def literal(name, rows):
    """A list as this file writes it: one row a line, double-quoted strings."""
    def quote(row):
        return f'"{row}"' if isinstance(row, str) else "(" + ", ".join(f'"{x}"' for x in row) + ")"

    return "\n".join([f"{name} = ["] + [f"    {quote(row)}," for row in rows] + ["]"])


@pytest.mark.parametrize("name", LISTS)
def test_nothing_breaks_the_layers_beyond_its_list(name):
    new, _ = compare(current()[name], globals()[name])
    assert not new, (f"{LISTS[name][1]}; these break it: {new}. Fix them (a row in {name} is for a "
                     f"break a step of issue 51's plan still has to remove, never for new code)")


@pytest.mark.parametrize("name", LISTS)
def test_every_allowed_row_still_occurs(name):
    _, gone = compare(current()[name], globals()[name])
    assert not gone, f"no longer in the tree: delete these rows from {name} in {__file__}: {gone}"


def test_every_quoted_include_names_a_file_of_the_tree():
    """An include the model cannot find would be one the lint cannot place in a layer."""
    lost = [f"{src}:{line}: {name}" for src, dst, name, line in include_edges(ROOT) if dst is None]
    assert not lost, lost


def test_the_model_matches_setup_py():
    """The folders, include dirs and extension modules assumed here are setup.py's: its FOLDERS
    table and its Extension()s' include_dirs (the written ones, in their order)."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension"]
    names = {call.args[0].value for call in calls}
    dirs = [tuple(node.value for node in ast.walk(keyword.value) if isinstance(node, ast.Constant))
            for call in calls for keyword in call.keywords if keyword.arg == "include_dirs"]
    folders = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
               and [getattr(t, "id", None) for t in node.targets] == ["FOLDERS"]]
    assert names == set(EXTENSIONS)
    written = {call.args[0].value: d for call, d in zip(calls, dirs)}
    assert len(dirs) == len(EXTENSIONS) and written == INCLUDE_DIRS, \
        f"setup.py's include_dirs {written}: update INCLUDE_DIRS"
    assert len(folders) == 1 and {k: tuple(v) for k, v in folders[0].items()} == MODULE_FOLDERS, \
        f"setup.py's FOLDERS {folders[0]}: update MODULE_FOLDERS"


def test_the_script_prints_the_lists_as_they_stand(capsys):
    main()
    printed = ast.parse(capsys.readouterr().out)
    rows = {node.targets[0].id: ast.literal_eval(node.value) for node in printed.body}
    assert rows == current()
    assert all(isinstance(row, (str, tuple)) for listed in rows.values() for row in listed)


def test_the_lists_here_are_written_as_the_script_writes_them():
    """So that pasting the script's output over them changes only the rows that changed."""
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    unlike = [name for name in LISTS if literal(name, globals()[name]) not in source]
    assert not unlike, f"write {unlike} sorted, one row a line, as `python {__file__}` prints them"


# ---------------------------------------------------------------------------------------------
# Self-checks: violations planted in a small tree must be reported, so the lint cannot pass blind
# ---------------------------------------------------------------------------------------------

def plant(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)


def test_a_planted_include_across_the_layers_is_reported(tmp_path):
    plant(tmp_path, {
        "src/module.c": '#include "module.h"\n#include "cuda/backend.h"\nconst char *s = "/*";\n'
                        '#include "kernels/dtypes.h"\n/* #include "hidden.h"\n */\n',
        "src/module.h": "",
        "src/hidden.h": "",
        "cuda/backend.h": '#  include "common.h"\n',   # its own folder's common.h comes first
        "cuda/common.h": "",
        "src/common.h": "",
        "cuda/kernel.cu": '#include "kernels/dtypes.h"\n#include "src/module.h"\n#include "hidden.h"\n',
        "kernels/dtypes.h": '#include "cpu/simd.h"\n',
        "cpu/simd.h": "",
    })
    assert include_violations(tmp_path) == [
        ("cuda/kernel.cu", "src/module.h"),
        ("kernels/dtypes.h", "cpu/simd.h"),
        ("src/module.c", "cuda/backend.h"),
    ]
    edges = include_edges(tmp_path)
    assert ("src/module.c", "kernels/dtypes.h", "kernels/dtypes.h", 4) in edges  # after the "/*" string
    assert not [edge for edge in edges if edge[1] == "src/hidden.h"]  # in a comment, or off cuda/'s path
    assert ("cuda/kernel.cu", None, "hidden.h", 3) in edges


def test_a_planted_call_cycle_is_reported(tmp_path):
    plant(tmp_path, {
        "src/a.c": "int helper(int x)\n{\n    return x;\n}\nint ampc_a(int x)\n{\n    return ampc_b(x);\n}\n",
        "src/b.c": "/* ampc_a( in a comment is no call */\nstatic int quiet(void) { return 0; }\n"
                   "int ampc_b(int x)\n{\n    return x ? ampc_a(x - 1) : quiet();\n}\n",
        "src/c.c": "static int quiet(void) { return helper(1); }\nint ampc_c(void)\n{\n    return ampc_a(2);\n}\n",
        "src/d.c": "int ampc_c(void);\nint ampc_d(int (*f)(void))\n{\n    return f == ampc_c;\n}\n",
        "cuda/e.cu": "namespace {\nint ampc_launch(int x)\n{\n    return x;\n}\n}\nint ampc_e(void) { return ampc_launch(1); }\n",
        "cuda/f.cu": "namespace {\nint ampc_launch(int x)\n{\n    return -x;\n}\n}\nint ampc_f(void) { return ampc_launch(2); }\n",
    })
    assert c_call_edges(tmp_path) == {"src/a.c": {"src/b.c"}, "src/b.c": {"src/a.c"}, "src/c.c": {"src/a.c"},
                                      "src/d.c": {"src/c.c"}, "cuda/e.cu": set(), "cuda/f.cu": set()}
    assert c_call_cycles(tmp_path) == [("src/a.c", "src/b.c")]


def test_planted_python_violations_are_reported(tmp_path):
    plant(tmp_path, {
        "ampc/__init__.py": "from ampc import core\n",
        "ampc/core.py": "from . import _C\nfrom .nn import layers\n",
        "ampc/nn/__init__.py": "",
        "ampc/nn/layers.py": "import json\nfrom ..core import helper\n\nclass Layer:\n"
                             "    def forward(self):\n        from ampc.nn import other\n",
        "ampc/nn/other.py": "def f():\n    import ampc.core\n    import json\n",
        "ampc/cli/__init__.py": "",
        "ampc/cli/main.py": "def main():\n    from ampc import core\n",
        "ampc/rewrites.py": "def _f():\n    pass\nglobals()['g'] = _f\n",
        "ampc/reads.py": "NAMES = list(globals().items())\n",
    })
    assert import_cycles(tmp_path) == [("ampc.core", "ampc.nn.layers")]
    assert function_imports(tmp_path) == [
        ("ampc.nn.layers", "Layer.forward", "ampc.nn.other"),
        ("ampc.nn.other", "f", "ampc.core"),
    ]
    assert globals_rewrites(tmp_path) == ["ampc.rewrites"]
    assert upward_imports(tmp_path) == [("ampc.core", "ampc.nn.layers")]  # and the CLI's import of core goes down
    assert rewrites_globals(ast.parse("globals().update(OPS)"))


def test_a_row_that_no_longer_occurs_is_reported():
    assert compare([("a", "b")], [("a", "b"), ("c", "d")]) == ([], [("c", "d")])
    assert compare([("a", "b"), ("e", "f")], [("a", "b")]) == ([("e", "f")], [])


def main():
    """Print each list as the tree stands, ready to paste over the lists above."""
    for name, rows in current().items():
        print(literal(name, rows))
        print()


if __name__ == "__main__":
    sys.exit(main())
