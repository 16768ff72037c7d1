#!/usr/bin/env bash
# One device session: build ampc (with ampc._cuda), print the doctor, run the
# whole test suite with the GPU required, run the kernels under
# compute-sanitizer, then the benchmarks. Logs go to $OUT (or ./out); the
# summary is printed last.
#
#   bash benchmarks/run_on_gpu.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0
status=0

step() { echo "== $1"; }

step build
if ! AMPC_CUDA=1 AMPC_WERROR=1 python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    exit 1
fi

step doctor
python3 -m ampc doctor | tee "$OUT/doctor.txt"

step tests
python3 -m pytest -q --require-gpu "$@" 2>&1 | tee "$OUT/tests.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step memcheck
if command -v compute-sanitizer >/dev/null; then
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/gpu_memcheck.py \
        >"$OUT/memcheck.log" 2>&1 || status=1
    tail -3 "$OUT/memcheck.log"
fi

step benchmarks
python3 benchmarks/cast.py --json "$OUT/cast.json" 2>&1 | tee "$OUT/cast.txt" | tail -20
exit $status
