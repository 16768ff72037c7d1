#!/usr/bin/env bash
# One device session: build ampc (with ampc._cuda), print the doctor, run the
# whole test suite with the GPU required, run the kernels under
# compute-sanitizer, the benchmarks, then the demo's training tables against
# torch. Logs go to $OUT (or ./out); the summary is printed last.
# SKIP="tests memcheck" (any of tests, memcheck, racecheck, initcheck, benchmarks, ops, demo) leaves
# steps out, to split the work over calls of 10 minutes; AMPC_CUDA_ARCH=90
# builds for the H200 alone, three times faster. SANITIZE_TESTS="tests/test_layers_gpu.py ..."
# also runs those GPU test files under each of compute-sanitizer's tools (SANITIZE_TOOLS, default
# "memcheck racecheck initcheck"), torch's caching allocator off so that its pool hides nothing.
#
#   bash benchmarks/run_on_gpu.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0
status=0

SKIP=${SKIP:-}
step() { echo "== $1"; }
skipped() { case " $SKIP " in *" $1 "*) echo "== $1 (skipped)"; return 0;; esac; return 1; }

step build
if ! AMPC_CUDA=1 AMPC_WERROR=1 python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    exit 1
fi

step doctor
python3 -m ampc doctor | tee "$OUT/doctor.txt"

if ! skipped tests; then
    step tests
    python3 -m pytest -q --require-gpu "$@" 2>&1 | tee "$OUT/tests.log" | tail -15
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

# compute-sanitizer's three tools over the kernels' tour (tests/gpu_memcheck.py): out-of-bounds and
# misaligned accesses, shared-memory races, reads of memory never written.
for tool in memcheck racecheck initcheck; do
    if ! skipped "$tool" && command -v compute-sanitizer >/dev/null; then
        step "$tool"
        timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 tests/gpu_memcheck.py \
            >"$OUT/$tool.log" 2>&1 || status=1
        tail -3 "$OUT/$tool.log"
    fi
done

# The GPU test files themselves under the sanitizer, a file and a tool at a time (slow: every
# launch is checked), each line of the table: tool, file, exit status, the sanitizer's summary.
for file in ${SANITIZE_TESTS:-}; do
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
        step "$tool $file"
        log="$OUT/sanitize_${tool}_$(basename "$file" .py).log"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 540 compute-sanitizer --tool "$tool" --error-exitcode 99 \
            python3 -m pytest -q -x -p no:cacheprovider --require-gpu "$file" >"$log" 2>&1
        rc=$?
        [ $rc -eq 0 ] || status=1
        echo "$tool $file rc=$rc $(grep -E 'ERROR SUMMARY|passed|failed' "$log" | tail -2 | tr '\n' ' ')" |
            tee -a "$OUT/sanitize_table.txt"
    done
done

if ! skipped benchmarks; then
    step benchmarks
    python3 benchmarks/cast.py --json "$OUT/cast.json" 2>&1 | tee "$OUT/cast.txt" | tail -20
    python3 benchmarks/scaler_diag.py 2>&1 | tee "$OUT/scaler_diag.txt"
    python3 benchmarks/scaler.py 2>&1 | tee "$OUT/scaler.txt"
fi

if ! skipped ops; then
    step ops
    python3 benchmarks/ops.py 2>&1 | tee "$OUT/ops.txt" | tail -40
fi

if ! skipped demo; then
    step demo
    python3 -m ampc demo 2>&1 | tee "$OUT/demo_mlp.txt" | tail -6
    python3 -m ampc demo --model resnet50 --batch-size 256 --compare-torch 2>&1 | tee "$OUT/demo_resnet50.txt" | tail -9
    python3 -m ampc demo --model resnet50 --batch-size 256 --channels-last --compare-torch 2>&1 |
        tee "$OUT/demo_resnet50_nhwc.txt" | tail -9
    python3 -m ampc demo --model gpt2 --batch-size 8 --compare-torch 2>&1 | tee "$OUT/demo_gpt2.txt" | tail -9
fi
exit $status
