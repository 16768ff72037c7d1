#!/usr/bin/env bash
# The working tree's GPU code against another revision's, timed in one device call (the device's
# copy of the tree has no git history, so the baseline's files travel in ab_base/):
#
#   here:       bash benchmarks/ab_on_gpu.sh prepare main   # REV's versions of the cuda/ and src/
#                                                           # files the tree changes, into ab_base/
#   the device: OPS="group_norm batch_norm" TESTS="tests/test_layers_gpu.py -k 'group_norm or batch_norm'" \
#               MATCH='nhwc' bash benchmarks/ab_on_gpu.sh run
#
# `run` builds the tree, runs pytest --require-gpu on TESTS (if given), times
# `benchmarks/ops.py --only $OPS` (only the rows MATCH finds, if given), puts ab_base/'s files in
# place, rebuilds (setup.py recompiles and relinks only what changed), times the same rows again,
# puts the tree's files back, and prints both builds' rows side by side with torch's (each build's
# torch column is its own run's). TREE_EXTRA, a command line, runs on the tree's build after its
# rows (its last TREE_EXTRA_LINES lines printed). Logs go to $OUT (or ./out). It leaves no library
# built (the next build on that machine compiles the tree's files). Delete ab_base/ before committing.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=ab_base

if [ "${1:-}" = prepare ]; then
    rev=${2:?which revision: bash benchmarks/ab_on_gpu.sh prepare REV}
    rm -rf "$BASE" && mkdir -p "$BASE"
    git diff --name-only "$rev" -- cuda src | while read -r f; do
        if [ ! -f "$f" ]; then
            echo "$f: not in the tree, left out (the baseline builds without it)"
        elif git cat-file -e "$rev:$f" 2>/dev/null; then
            mkdir -p "$BASE/$(dirname "$f")"
            git show "$rev:$f" >"$BASE/$f"
        else
            echo "$f: new in the tree, which the baseline build keeps"
        fi
    done
    echo "$rev" >"$BASE/REV"
    find "$BASE" -type f | sort
    exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 prepare REV | run" >&2; exit 2; }
[ -f "$BASE/REV" ] || { echo "no $BASE/: run 'prepare REV' here first" >&2; exit 2; }

OUT=${OUT:-out}; mkdir -p "$OUT"
export AMPC_CUDA=1 AMPC_WERROR=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
export AMPC_CUDA_ARCH=${AMPC_CUDA_ARCH:-90}
T0=$(date +%s)
lap() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
build() {
    python3 setup.py build_ext --inplace >"$OUT/build_$1.log" 2>&1 || { tail -30 "$OUT/build_$1.log"; exit 1; }
    lap "build $1"
}
ops() {
    timeout "${OPS_S:-200}" python3 benchmarks/ops.py --repeat "${REPEAT:-20}" --only ${OPS:?which ops.py rows} \
        ${MATCH:+--match "$MATCH"} >"$OUT/ops_$1.txt" 2>&1
    lap "ops $1"
}
swap() {  # swap the tree's files and the baseline's
    (cd "$BASE" && find cuda src -type f 2>/dev/null) | while read -r f; do
        mv "$f" "$f.ab_tmp" && mv "$BASE/$f" "$f" && mv "$f.ab_tmp" "$BASE/$f"
        touch "$f"  # mv keeps the older time, and setup.py rebuilds only what is newer than its objects
    done
}

build tree
if [ -n "${TESTS:-}" ]; then
    eval "python3 -m pytest -q -p no:cacheprovider --require-gpu $TESTS" >"$OUT/tests.log" 2>&1  # eval: TESTS may quote a -k expression
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
    tail -1 "$OUT/tests.log"
    lap tests
fi
ops tree
if [ -n "${TREE_EXTRA:-}" ]; then  # more on the tree's build (a profile, a demo), its output in tree_extra.log
    eval "$TREE_EXTRA" >"$OUT/tree_extra.log" 2>&1
    tail -"${TREE_EXTRA_LINES:-20}" "$OUT/tree_extra.log"
    lap "tree extra"
fi
swap
build "base"
ops base
swap
# The build now holds the baseline's code, and the device's next call recopies the tree with this
# machine's (older) file times, which setup.py would take for up to date: drop the swapped files'
# objects and both libraries, so that the next build compiles the tree's files and relinks.
(cd "$BASE" && find cuda src -type f 2>/dev/null) | while read -r f; do
    rm -f build/temp*/"${f%.*}.o"
done
rm -f build/lib*/ampc/_C.* build/lib*/ampc/_cuda.* ampc/_C.*.so ampc/_cuda.*.so
python3 - "$OUT" "$(cat "$BASE/REV")" <<'PY'
import re
import sys

out, rev = sys.argv[1], sys.argv[2]


def rows(name):
    found = {}
    for line in open(f"{out}/ops_{name}.txt"):
        # the shape column is 18 wide, but conv2d's shapes run past it
        m = re.match(r"(.{28}) (.+?)\s+(fp32|fp16|bf16)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            found[(m[1].strip(), m[2].strip(), m[3])] = (float(m[4]), float(m[5]))
    return found


tree, base = rows("tree"), rows("base")
print(f"{'op':<28}{'shape':<23}{'dtype':<6}{rev[:9]:>9}{'torch':>9}{'tree':>9}{'torch':>9}  base/tree")
for key, (t, tt) in tree.items():
    b, bt = base.get(key, (float("nan"), float("nan")))
    print(f"{key[0]:<28}{key[1]:<23}{key[2]:<6}{b:9.3f}{bt:9.3f}{t:9.3f}{tt:9.3f}  {b / t:6.2f}x")
PY
