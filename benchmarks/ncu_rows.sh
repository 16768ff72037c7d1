#!/usr/bin/env bash
# What ncu measures of the kernels of benchmarks/ops.py's rows, ampc's and torch's, on the device:
#
#   bash benchmarks/ncu_rows.sh 'batch_norm bwd .*2048x7\^2 nhwc fp32' batch_norm
#
# The first argument is a regular expression over a row's "op shape dtype" (ops.py --profile), the
# rest name the ops.py benchmarks to look in (--only). ops.py runs one ampc call and then one torch
# call of each matching row inside the CUDA profiler's range; ncu profiles each of their kernels,
# replaying it once per metric group, with the L2 and the clocks left as they run
# (--cache-control none --clock-control none: a kernel's reads from the L2 count as in a real step,
# though a replayed kernel finds what its own replay left there). The table: each kernel's time,
# DRAM bytes read and written, DRAM throughput against its peak, L2 hit rate, grid, block,
# occupancy and registers. NCU_SECTIONS="SpeedOfLight WarpStateStats ..." prints ncu's own report of
# those sections instead (where a kernel stalls, not only how long it runs). Logs go to $OUT (or ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
pattern=${1:?usage: bash benchmarks/ncu_rows.sh REGEX OP [OP ...]}
shift
[ $# -gt 0 ] || { echo "name the ops.py benchmarks to look in (linear, batch_norm, ...)" >&2; exit 2; }
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [ -n "${NCU_SECTIONS:-}" ]; then  # ncu's own report of those sections, kernel by kernel, in place of the table
    sections=$(for s in $NCU_SECTIONS; do printf -- '--section %s ' "$s"; done)
    timeout "${NCU_S:-300}" ncu --profile-from-start off --cache-control none --clock-control none $sections \
        python3 benchmarks/ops.py --profile "$pattern" --only "$@" >"$OUT/ncu_sections.txt" 2>&1
    echo "ncu exited with $?"
    grep -vE "^==PROF==|^ +-+( +-+)+ *$|^ *$" "$OUT/ncu_sections.txt" | cut -c1-150 | head -400
    exit 0
fi
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
METRICS=$METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct
METRICS=$METRICS,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,launch__registers_per_thread
timeout "${NCU_S:-300}" ncu --profile-from-start off --cache-control none --clock-control none --csv \
    --metrics "$METRICS" python3 benchmarks/ops.py --profile "$pattern" --only "$@" \
    >"$OUT/ncu_rows.csv" 2>"$OUT/ncu_rows.err"
rc=$?
grep "^profiled:" "$OUT/ncu_rows.csv"
[ $rc -eq 0 ] || { echo "ncu exited with $rc:"; tail -5 "$OUT/ncu_rows.err"; }
python3 - "$OUT/ncu_rows.csv" <<'PY'
import csv
import sys

SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1,
         "ms": 1e3, "msecond": 1e3}


def number(value, unit):
    """A metric in bytes or microseconds (ncu picks its own units and writes thousands with commas)."""
    try:
        return float(value.replace(",", "")) * SCALE.get(unit, 1)
    except ValueError:
        return float("nan")


rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no kernels profiled: does the pattern match a row of those benchmarks?")
header, kernels = rows[0], {}
at = {name: header.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
for r in rows[1:]:
    metrics = kernels.setdefault(r[at["ID"]], {"name": r[at["Kernel Name"]]})
    metrics[r[at["Metric Name"]]] = number(r[at["Metric Value"]], r[at["Metric Unit"]])
print(f"{'kernel':<64} {'us':>8} {'read MB':>8} {'written':>8} {'DRAM %':>7} {'L2 hit':>7} "
      f"{'grid':>7} {'block':>6} {'occ %':>6} {'regs':>5}")
COLUMNS = [("gpu__time_duration.sum", 1, "8.1f"), ("dram__bytes_read.sum", 1e6, "8.1f"),
           ("dram__bytes_write.sum", 1e6, "8.1f"), ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 1, "7.1f"),
           ("lts__t_sector_hit_rate.pct", 1, "7.1f"), ("launch__grid_size", 1, "7.0f"),
           ("launch__block_size", 1, "6.0f"), ("sm__warps_active.avg.pct_of_peak_sustained_active", 1, "6.1f"),
           ("launch__registers_per_thread", 1, "5.0f")]
for m in kernels.values():
    print(f"{m['name'][:64]:<64} " + " ".join(format(m.get(name, float("nan")) / unit, f) for name, unit, f in COLUMNS))
PY
