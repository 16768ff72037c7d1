#!/usr/bin/env bash
# One device session: build ampc (with ampc._cuda), print the doctor, run the
# whole test suite with the GPU required, run the kernels under
# compute-sanitizer, the benchmarks, then the demo's training tables against
# torch. Logs go to $OUT (or ./out); the summary is printed last.
# SKIP="tests memcheck" (any of build, tests, memcheck, racecheck, initcheck, benchmarks, ops, demo) leaves
# steps out, to split the work over calls of 10 minutes; AMPC_CUDA_ARCH=90
# builds for the H200 alone, three times faster. SANITIZE_TESTS="tests/test_layers_gpu.py ..."
# also runs those GPU test files under each of compute-sanitizer's tools (SANITIZE_TOOLS, default
# "memcheck racecheck initcheck"; SANITIZE_SHARDS, SANITIZE_JOBS, SANITIZE_TIMEOUT (seconds a process,
# default 540); SANITIZE_FLAGS, more options for compute-sanitizer; SANITIZE_K, a pytest -k
# expression for those processes: "not conv" leaves out the convolution tests, whose cuDNN kernels
# take minutes a test under racecheck), torch's caching allocator off so that its pool hides nothing;
# AMPC_TEST_FROM=k (tests/conftest.py) starts each file at its k-th test, to finish a run that ran out
# of time. SANITIZE_PLAN=FILE runs FILE's lines instead, each "tool file shard [from [-k expression]]"
# (e.g. "racecheck tests/test_ops_gpu.py 1/4 636" or "initcheck tests/test_spatial_gpu.py 0/3 0
# conv"), SANITIZE_JOBS at once: one call for what the runs before left unfinished.
# racecheck's verdict is the reports outside the libraries' kernels: see LIBRARY_KERNELS below.
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

if ! skipped build; then
    step build
    if ! AMPC_CUDA=1 AMPC_WERROR=1 python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
        tail -40 "$OUT/build.log"
        exit 1
    fi
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

# The GPU test files themselves under the sanitizer, each in SANITIZE_SHARDS parts (tests/conftest.py's
# AMPC_TEST_SHARD), SANITIZE_JOBS processes at once (slow: every launch is checked), a line each in
# sanitize_table.txt: tool, file, shard, exit status, the sanitizer's summary and pytest's. Tests that
# prove a call never waited for the GPU skip there (AMPC_UNDER_SANITIZER, the tool's name).
# cuBLAS's Hopper kernels (nvjet_sm90_*) and cuDNN's generated ones copy through the tensor memory
# accelerator, which racecheck does not follow: every report it printed over test_layers_gpu and
# test_ops_gpu was in an nvjet kernel (H100, 2026-12-06). Left out of the instrumentation
# (--kernel-name-exclude), they made racecheck stop at their first launch instead ("failed to handle a
# hardware exception", an illegal address; H200, the same day), so racecheck instruments them, and the
# table counts the reports in other kernels: ampc's, the verdict. torch's own elementwise kernels
# (at::native, no such copies) stay out, which saves their instrumentation. racecheck synchronizes after
# every launch (--force-synchronization-limit 1): left to queue launches, its record of test_attention_gpu's
# GPT-2 demo test grew to 110 GB of the host's 128 GB within two minutes and the OOM killer ended it;
# synchronized, the test peaked at 4.4 GB and passed in 232-318 s (H100, 2026-12-07).
# initcheck instruments every kernel: what a kernel left out writes, the next kernel reads as never
# written (with torch's kernels left out, ampc's embedding read torch.randint's indices so; H100,
# 2026-12-06). It prints every report without backtraces, which the table counts by kernel: torch's own
# (cub's scans, direct copies) ran to 565,000 a shard of test_layers_gpu and hid the rest past the
# default limit of 100. cuBLASLt's splitKreduce_kernel reads the partial sums its TMA kernels wrote:
# 4,608-15,616 reports a shard of test_ops_gpu and test_attention_gpu, every one in that kernel
# (H100, 2026-12-06, twenty-first session); hence cublasLt among the libraries. JAX's kernels, in
# test_autocast_gpu's interop tests, are XLA's: its autotuner's output comparisons
# (stream_executor::gpu::xla_fp_comparison) and its fusions (wrapped_compare: XLA names a one-op
# fusion wrapped_<op>). Logs past 20 MB keep their first 20 MB.
LIBRARY_KERNELS="nvjet|cudnn|cublasLt|xmma|cutlass|at6native|at::native|at_cuda_detail|sm90_|sm80_|stream_executor|wrapped_"
# memcheck also reports each CUDA call that returned an error ("Program hit ... on CUDA API call to"),
# and those count in its ERROR SUMMARY: the table names the library that made the call, the first host
# frame past the CUDA driver and runtime. NCCL's start-up asks cudaFuncGetAttributes of each of its
# kernels and passes over those built for other GPUs (cudaErrorNoKernelImageForDevice): 24-40 a process
# of test_distributed_torch, the whole of its memcheck errors (H100, 2026-12-07); ampc's calls would name
# ampc's _cuda module.
LIBRARY_CALLERS="libnccl|libcudnn|libcublas|libtorch|libc10|jaxlib|libxla|cupy"
# The most resident memory (kB) that process $1 and its descendants held at once, sampled every 2 s until
# it ends. Under racecheck, before its launches were synchronized (above), test_attention_gpu's GPT-2 demo
# test grew to 110 GB of the host's 128 GB within two minutes, and the OOM killer ended it (rc 9, no
# pytest summary; H100, 2026-12-07): the table prints the peak so that such an end is told from a crash.
peak_tree_rss() {
    local root=$1 peak=0 now state
    while state=$(ps -o stat= -p "$root") && [ "${state:0:1}" != Z ]; do  # ended: gone, or a zombie until waited for
        now=$(ps -eo pid=,ppid=,rss= | awk -v root="$root" '{parent[$1] = $2; rss[$1] = $3}
            END {for (p in parent) {q = p; while (q != "" && q != root && q > 1) q = parent[q]
                                    if (q == root) n += rss[p]}
                 print n + 0}')
        [ "$now" -gt "$peak" ] && peak=$now
        sleep 2
    done
    echo "$peak"
}
# racecheck and initcheck take cuDNN's convolution ranking untimed (AMPC_CUDNN_BENCHMARK=0): timing a
# shape's candidates (FindEx's algorithms, then the fastest again, then the graph API's engines) ran
# dozens of instrumented cuDNN kernels a pass and took minutes a convolution test, and
# ampc's own kernels, the verdict, run the same either way; memcheck times them as users do.
# Likewise cuBLASLt's heuristic untimed (AMPC_GEMM_TUNING=0): test_ops_gpu's products, each shape's
# first call timing four algorithms three times, ran 5 tests a process in 320 s under racecheck.
sanitize_one() {  # tool file shard [from [-k expression]]
    local from=${4:-${AMPC_TEST_FROM:-0}} k="${*:5}" flags="" timed=1
    k=${k:-${SANITIZE_K:-}}
    local log="$OUT/sanitize/$1_$(basename "$2" .py)_${3/\//of}_from${from}$(echo "${k:+_$k}" | tr -c 'A-Za-z0-9_\n' -).log"
    [ "$1" = racecheck ] && flags="--kernel-name-exclude kns=at6native --force-synchronization-limit 1 --print-limit 100000" timed=0
    [ "$1" = initcheck ] && flags="--print-limit 100000000 --show-backtrace no" timed=0
    AMPC_CUDNN_BENCHMARK=$timed AMPC_GEMM_TUNING=$timed AMPC_UNDER_SANITIZER=$1 AMPC_TEST_SHARD=$3 \
        AMPC_TEST_FROM=$from PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-540}" \
        compute-sanitizer --tool "$1" --error-exitcode 99 $flags ${SANITIZE_FLAGS:-} \
        python3 -m pytest -q -x -p no:cacheprovider --require-gpu ${k:+-k "$k"} "$2" >"$log" 2>&1 &
    local pid=$!
    local peak_gb=$(peak_tree_rss $pid | awk '{printf "%.1f", $1 / 1048576}')
    wait $pid
    local rc=$?
    # the kernels the reports name, so that the table says where even when the logs are lost
    # (a template's return type, "T1", skipped; an anonymous namespace kept)
    local kernels=$(grep -oE "(access | {4,})at (void |T[0-9]+ )?(<unnamed>::)?[A-Za-z_][A-Za-z0-9_:]*" "$log" |
        sed -E 's/.* at (void |T[0-9]+ )?//' | sort | uniq -c | sort -rn)
    local where=$(echo "$kernels" | head -1 | awk 'NF {print "most in " $2 " (" $1 ")"}')
    local outside=$(echo "$kernels" | grep -vE "$LIBRARY_KERNELS")
    local ours=$(echo "$outside" | awk '{n += $1} END {print n + 0}')
    local ours_where=$(echo "$outside" | head -1 | awk 'NF {print "(most in " $2 ", " $1 ")"}')
    local callers=$(awk '/Program hit/ {want = 1; next} /^=+ *$/ {want = 0}
        want && /Host Frame:/ && !/ in libcuda(rt)?\.so/ {print $NF; want = 0}' "$log" | sort | uniq -c | sort -rn)
    local api=$(echo "$callers" | awk '{n += $1} END {print n + 0}')
    local api_ours=$(echo "$callers" | grep -vE "$LIBRARY_CALLERS" | awk '{n += $1} END {print n + 0}')
    echo "$1 $2 $3 from=$from${k:+ -k '$k'} rc=$rc $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1) $(grep -E 'passed|failed' "$log" | tail -1)" \
        "reports outside the libraries: $ours ${ours_where} ${where}" \
        "${callers:+API errors: $api, outside the libraries: $api_ours (most from $(echo "$callers" | awk 'NR == 1 {print $2}')) }peak host memory ${peak_gb} GB"
    if [ "$(stat -c %s "$log")" -gt 20000000 ]; then truncate -s 20000000 "$log"; fi
}
if [ -n "${SANITIZE_TESTS:-}${SANITIZE_PLAN:-}" ]; then
    step "sanitizers over ${SANITIZE_PLAN:-${SANITIZE_TESTS}}"
    export -f sanitize_one peak_tree_rss
    export OUT SANITIZE_TIMEOUT SANITIZE_FLAGS SANITIZE_K LIBRARY_KERNELS LIBRARY_CALLERS
    mkdir -p "$OUT/sanitize"
    shards=${SANITIZE_SHARDS:-1}
    if [ -n "${SANITIZE_PLAN:-}" ]; then
        grep -Ev '^ *(#|$)' "$SANITIZE_PLAN"  # blank lines and comments left out
    else
        for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
            for file in $SANITIZE_TESTS; do
                for ((i = 0; i < shards; i++)); do echo "$tool $file $i/$shards"; done
            done
        done
    fi | xargs -P "${SANITIZE_JOBS:-4}" -L 1 bash -c 'sanitize_one "$@"' _ | tee -a "$OUT/sanitize_table.txt"
    grep -qv ' rc=0 ' "$OUT/sanitize_table.txt" && status=1
    # one file, not one a process: the device tool brings back at most 8
    tar czf "$OUT/sanitize_logs.tgz" -C "$OUT" sanitize && rm -rf "$OUT/sanitize"
fi

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
