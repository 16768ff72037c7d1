#!/usr/bin/env bash
# The working tree against a whole other revision, for trees whose files moved since (ab_on_gpu.sh
# swaps single files in place, which a moved file defeats). Both trees are built side by side and
# each runs its own benchmarks, alternating, in one device call:
#
#   here:       bash benchmarks/ab_archive.sh prepare REV     # REV's tree into ab_base.tar (ignored by
#                                                             # git: pass it to the device in `carry`)
#   the device: bash benchmarks/ab_archive.sh run
#
# `run` unpacks ab_base.tar into $BASE_DIR, builds it and the working tree at once, then runs
# ROUNDS rounds (default 1) of benchmarks/ops.py (--repeat $REPEAT, default 20) and
# benchmarks/scaler.py (--repeat $SCALER_REPEAT, default 30) on each build, the baseline first in
# odd rounds and the tree first in even ones, and prints each ampc time of both builds, with the
# ratio base/tree (above 1: the tree is faster) and each run's torch time beside it (the same
# kernels in both runs: their ratio is the run-to-run noise). Logs go to $OUT (or ./out).
# OPS_MATCH=REGEX times only the ops.py rows it finds (ops.py --match); SCALER_REPEAT=0 leaves
# scaler.py out: a second look at a few rows.
set -uo pipefail
cd "$(dirname "$0")/.."
TREE=$PWD

if [ "${1:-}" = prepare ]; then
    rev=${2:?which revision: bash benchmarks/ab_archive.sh prepare REV}
    git archive --format=tar --prefix=base/ "$rev" >ab_base.tar && echo "$rev" >ab_base.rev
    tar -rf ab_base.tar --transform 's|^|base/|' ab_base.rev && rm ab_base.rev
    ls -l ab_base.tar
    exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 prepare REV | run" >&2; exit 2; }
[ -f ab_base.tar ] || { echo "no ab_base.tar: run 'prepare REV' here first" >&2; exit 2; }

OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
BASE_DIR=${BASE_DIR:-/tmp/ab_archive}
export AMPC_CUDA=1 AMPC_WERROR=1 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export AMPC_CUDA_ARCH=${AMPC_CUDA_ARCH:-90}
T0=$(date +%s)
lap() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }

rm -rf "$BASE_DIR" && mkdir -p "$BASE_DIR" && tar -xf ab_base.tar -C "$BASE_DIR"
BASE=$BASE_DIR/base
(cd "$BASE" && python3 setup.py build_ext --inplace >"$OUT/build_base.log" 2>&1) & base_build=$!
(cd "$TREE" && python3 setup.py build_ext --inplace >"$OUT/build_tree.log" 2>&1) & tree_build=$!
wait $base_build || { tail -30 "$OUT/build_base.log"; exit 1; }
wait $tree_build || { tail -30 "$OUT/build_tree.log"; exit 1; }
lap builds

bench() {  # bench NAME DIR ROUND: that tree's own benchmarks on its own build
    (cd "$2" && export PYTHONPATH=$2 &&
        timeout "${OPS_S:-240}" python3 benchmarks/ops.py --repeat "${REPEAT:-20}" ${OPS_MATCH:+--match "$OPS_MATCH"} \
            >"$OUT/ops_$1_$3.txt" 2>&1 &&
        { [ "${SCALER_REPEAT:-30}" = 0 ] ||
            timeout "${SCALER_S:-150}" python3 benchmarks/scaler.py --repeat "${SCALER_REPEAT:-30}" \
                >"$OUT/scaler_$1_$3.txt" 2>&1; })
    lap "$1 round $3"
}
for round in $(seq 1 "${ROUNDS:-1}"); do
    if [ $((round % 2)) = 1 ]; then bench base "$BASE" "$round"; bench tree "$TREE" "$round"
    else bench tree "$TREE" "$round"; bench base "$BASE" "$round"; fi
done

python3 - "$OUT" "$(cat "$BASE/ab_base.rev")" "${ROUNDS:-1}" "${SCALER_REPEAT:-30}" <<'PY'
import re
import statistics
import sys

out, rev, rounds, scaler = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] != "0"


def ops_rows(text):
    found = {}
    for line in text.splitlines():
        # the shape column is 18 wide, but conv2d's shapes run past it
        m = re.match(r"(.{28}) (.+?)\s+(fp32|fp16|bf16)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            found[f"{m[1].strip()} {m[2].strip()} {m[3]}"] = (float(m[4]), float(m[5]))
    return found


# scaler.py's tables: (title, the columns of ampc's times, the column of torch's) by position
# among each row's numbers (percentages and speed-ups dropped)
SCALER = {"unscale + inf check": ([4], 3), "unscale + clip": ([2, 6], 1),
          "whole iteration": ([2], 1), "iteration, clip": ([2, 4], 0)}


def scaler_rows(text):
    found, table = {}, None
    for line in text.splitlines():
        title = next((t for t in SCALER if line.startswith(t)), None)
        if title:
            table = title
            continue
        if table is None or not line.strip() or line.startswith("("):
            continue
        numbers = [float(x) for x in re.findall(r"(?<![\w.])(\d+\.\d+|\d+)(?![\w.%x])", line)]
        name = line[:18].strip() + ("" if table != "whole iteration" else " " + line[18:30].strip())
        ours, torch_col = SCALER[table]
        try:
            for k, col in enumerate(ours):
                found[f"{table}: {name} #{k}"] = (numbers[col], numbers[torch_col])
        except IndexError:
            pass
    return found


def median_rows(kind, name, parse):
    runs = []
    for r in range(1, rounds + 1):
        with open(f"{out}/{kind}_{name}_{r}.txt") as f:
            runs.append(parse(f.read()))
    return {k: tuple(statistics.median(run[k][i] for run in runs if k in run) for i in (0, 1))
            for k in runs[0] if all(k in run for run in runs)}


worst = []
kinds = (("ops", ops_rows), ("scaler", scaler_rows)) if scaler else (("ops", ops_rows),)
for kind, parse in kinds:
    base, tree = median_rows(kind, "base", parse), median_rows(kind, "tree", parse)
    print(f"\n{kind}: ms, {rev[:9]} | tree (median of {rounds}); base/tree above 1: the tree is faster; "
          f"torch's base/tree is the noise")
    print(f"{'row':<62}{'base':>9}{'tree':>9}{'base/tree':>10}{'torch b/t':>10}")
    for key, (t, tt) in tree.items():
        if key not in base:
            continue
        b, bt = base[key]
        ratio, noise = b / t if t else float("nan"), bt / tt if tt else float("nan")
        worst.append((ratio / noise if noise else ratio, ratio, noise, key))
        print(f"{key[:61]:<62}{b:9.3f}{t:9.3f}{ratio:9.2f}x{noise:9.2f}x")
worst.sort()
print("\nthe tree's slowest rows against the base, each over torch's own drift in the same runs:")
for score, ratio, noise, key in worst[:8]:
    print(f"  {key[:70]:<72} base/tree {ratio:.2f}x, torch {noise:.2f}x")
PY
lap done
