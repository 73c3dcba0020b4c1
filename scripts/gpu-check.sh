#!/bin/bash
# One prepared run on a machine with one NVIDIA GPU, from the repository root:
# build for that GPU's architecture only, the CUDA test suite on the device,
# compute-sanitizer (memcheck, racecheck) on small cases, a device-to-device
# copy bandwidth probe and the attention benchmark (batch 1 and 64 x context
# 8k and 32k x fp16/int8/int4). About 8 minutes in all: every step runs under
# `timeout` within an overall budget, a failed step does not stop the others,
# and everything it writes goes under OUTDIR:
#
#   OUTDIR/steps.jsonl    one JSON line per step: step, status, seconds, rc, log, note
#   OUTDIR/bench.jsonl    one JSON line per benchmark case (kvpage-bench's last JSON line inside;
#                         bench-raw.jsonl: every JSON line it printed)
#   OUTDIR/summary.txt    the table printed at the end (step, status, seconds, note)
#   OUTDIR/logs/STEP.log  each step's output
#
#   scripts/gpu-check.sh [--sim] OUTDIR
#
# Without a GPU (or with --sim) it runs what it can: the build (by default the
# main build in build/, so an up-to-date tree costs seconds), the kernel
# simulator's suite (build/tests/test_cuda_sim) in place of the device tests,
# and the summary; every step that needs the device is reported SKIPPED with
# the reason. Exit status: 1 when a step FAILED or TIMED OUT, else 0.
#
# Environment: KVP_GPU_CHECK_BUDGET (seconds, 480), KVP_GPU_CHECK_STEPS (the
# device steps to run: test-cuda copy-probe bench memcheck racecheck; all),
# BUILD_ROOT (build/gpu-check on a GPU, build with --sim), CUDA_ARCHS (the
# GPU's; the Makefile's with --sim), NVCCFLAGS (the Makefile's, plus
# --split-compile=0 on a GPU), JOBS (make -j; the number of CPUs), NVCC, MAKE.
set -u
cd "$(dirname "$0")/.." || exit 2

sim=0
out=""
for a in "$@"; do
    case "$a" in
    --sim) sim=1 ;;
    -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-check: unknown option '$a' (usage: scripts/gpu-check.sh [--sim] OUTDIR)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu-check: one OUTDIR only" >&2; exit 2; }; out=$a ;;
    esac
done
[ -n "$out" ] || { echo "usage: scripts/gpu-check.sh [--sim] OUTDIR" >&2; exit 2; }
mkdir -p "$out/logs" || exit 2
out=$(cd "$out" && pwd)
: >"$out/steps.jsonl"
: >"$out/bench.jsonl"
: >"$out/bench-raw.jsonl"
: >"$out/summary.rows"

budget=${KVP_GPU_CHECK_BUDGET:-480}
t_start=$(date +%s)
make=${MAKE:-make}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
nvcc=${NVCC:-$(command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })}
cuda_home=""
[ -n "$nvcc" ] && cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")

# KVP_GPU_CHECK_STEPS: the device steps to run (test-cuda copy-probe bench
# memcheck racecheck; default all): a second run for what a first one left
wanted() { [ -z "${KVP_GPU_CHECK_STEPS:-}" ] || case " $(echo "$KVP_GPU_CHECK_STEPS" | tr ',' ' ') " in *" $1 "*) true ;; *) false ;; esac; }

# ---- steps ---------------------------------------------------------------------
json_str() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr '\n\t' '  '; }
left() { echo $((budget - ($(date +%s) - t_start))); }

# record STEP STATUS SECONDS RC NOTE
record() {
    printf '{"step": "%s", "status": "%s", "seconds": %s, "rc": %s, "log": "logs/%s.log", "note": "%s"}\n' \
        "$1" "$2" "$3" "$4" "$1" "$(json_str "$5")" >>"$out/steps.jsonl"
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$5" >>"$out/summary.rows"
    printf '[gpu-check] %-22s %-9s %5ss  %s\n' "$1" "$2" "$3" "$5"
}

skip() { # STEP REASON
    echo "SKIPPED: $2" >"$out/logs/$1.log"
    record "$1" SKIPPED 0 null "$2"
}

# run STEP TIMEOUT NOTE CMD...: CMD under `timeout`, within what is left of
# the budget; output to logs/STEP.log. Sets $rc.
run() {
    local step=$1 limit=$2 note=$3
    shift 3
    local remain
    remain=$(left)
    if [ "$remain" -lt 10 ]; then
        skip "$step" "the time budget (${budget} s, KVP_GPU_CHECK_BUDGET) is spent"
        rc=125
        return
    fi
    [ "$limit" -gt "$remain" ] && limit=$remain
    local t0 t1 status
    t0=$(date +%s)
    printf '$ %s\n' "$*" >"$out/logs/$step.log"
    timeout -k 10 "$limit" "$@" >>"$out/logs/$step.log" 2>&1 </dev/null
    rc=$?
    t1=$(date +%s)
    if [ "$rc" -eq 0 ]; then
        status=PASS
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status=TIMEOUT
        note="${note:+$note; }stopped after $limit s"
    else
        status=FAIL
        note="${note:+$note; }exit $rc: $(grep -v '^\$ ' "$out/logs/$step.log" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-120)"
    fi
    record "$step" "$status" $((t1 - t0)) "$rc" "$note"
}

echo "gpu-check: writing to $out; every step under timeout, $budget s in all (KVP_GPU_CHECK_BUDGET)$([ "$sim" = 1 ] && echo '; --sim: no device steps')"

# ---- 1. the GPU ---------------------------------------------------------------------
gpu=0
arch=""
gpu_why=""
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with local changes)')"
    echo "host: $(uname -srm), $jobs CPUs"
    echo "nvcc: ${nvcc:-not found}$([ -n "$nvcc" ] && "$nvcc" --version | tail -n 1 | sed 's/^/, /')"
} >"$out/env.txt"
t0=$(date +%s)
if [ "$sim" = 1 ]; then
    gpu_why="--sim: the device steps are not run"
elif ! command -v nvidia-smi >/dev/null 2>&1 && ! [ -x "${cuda_home:-/nonexistent}/bin/__nvcc_device_query" ]; then
    gpu_why="no GPU: neither nvidia-smi nor nvcc's __nvcc_device_query is available"
else
    {
        timeout 30 nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
            --format=csv 2>&1
        timeout 30 nvidia-smi 2>&1
    } >"$out/logs/gpu.log"
    cc=$(timeout 30 nvidia-smi -i 0 --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    case "$cc" in
    [0-9][0-9] | [0-9][0-9][0-9]) ;;
    *) # older drivers have no compute_cap field: nvcc's own probe
        cc=$(timeout 30 "${cuda_home:-/nonexistent}/bin/__nvcc_device_query" 2>>"$out/logs/gpu.log" | tr ',' '\n' | head -n 1)
        ;;
    esac
    case "$cc" in
    [0-9][0-9] | [0-9][0-9][0-9]) gpu=1; arch=$cc ;;
    *) gpu_why="no GPU found (nvidia-smi / __nvcc_device_query: see logs/gpu.log)" ;;
    esac
fi
if [ "$gpu" = 1 ]; then
    name=$(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    echo "gpu: $name, sm_$arch" >>"$out/env.txt"
    record gpu PASS $(($(date +%s) - t0)) 0 "$name, compute capability ${arch%?}.${arch#"${arch%?}"} (sm_$arch)"
else
    echo "gpu: none ($gpu_why)" >>"$out/env.txt"
    [ -f "$out/logs/gpu.log" ] || echo "$gpu_why" >"$out/logs/gpu.log"
    record gpu SKIPPED $(($(date +%s) - t0)) null "$gpu_why"
fi

# ---- 2. build dependencies and the build ---------------------------------------------------
run deps 120 "scripts/ensure-deps.sh test" scripts/ensure-deps.sh test

if [ "$gpu" = 1 ]; then
    root=${BUILD_ROOT:-build/gpu-check}
    archs=${CUDA_ARCHS:-$arch}
else
    root=${BUILD_ROOT:-build}
    archs=${CUDA_ARCHS:-}
fi
B=$root # the Makefile's BUILD (SAN=0)
build_ok=0
build_why="the build failed (logs/build.log)"
if [ -z "$nvcc" ]; then
    build_why="nvcc not found (PATH, /usr/local/cuda/bin): no CUDA build"
    skip build "$build_why"
else
    if [ "$gpu" = 1 ]; then
        # the library and kvpage-bench, the device tests
        targets="all $B/tests/test_cuda_gpu $B/tests/test_cuda_device"
    else
        # the simulator's suite needs no nvcc object: cuda/*.cu built as C++
        targets="$B/tests/test_cuda_sim"
    fi
    arch_note=""
    [ -n "$archs" ] && arch_note=" CUDA_ARCHS='$archs'"
    # On the GPU machine: nvcc optimizes the functions of a file on every
    # CPU (--split-compile=0; "minimal, if any, impact" on the code): the
    # attention kernels (cuda/attention_d*.cu) take minutes for ptxas alone.
    nvccflags=${NVCCFLAGS:-}
    if [ "$gpu" = 1 ] && [ -z "$nvccflags" ]; then
        nvccflags="$("$make" --no-print-directory -s HAVE_CUDA=1 BUILD_ROOT="$root" \
            --eval 'kvp-gpu-check-flags: ; @echo $(NVCCFLAGS)' kvp-gpu-check-flags 2>/dev/null) --split-compile=0"
    fi
    [ -n "$nvccflags" ] && arch_note="$arch_note NVCCFLAGS='$nvccflags'"
    # shellcheck disable=SC2086
    run build 330 "make -j$jobs BUILD_ROOT=$root HAVE_CUDA=1$arch_note $targets" \
        "$make" -j"$jobs" BUILD_ROOT="$root" HAVE_CUDA=1 ${archs:+CUDA_ARCHS="$archs"} \
        ${nvccflags:+NVCCFLAGS="$nvccflags"} $targets
    [ "$rc" -eq 0 ] && build_ok=1
    echo "build: BUILD_ROOT=$root CUDA_ARCHS=${archs:-as the Makefile sets it} NVCCFLAGS=${nvccflags:-as the Makefile sets it}" >>"$out/env.txt"
fi

# The kernels' registers, shared memory and spills, from the ptxas reports
# the build keeps beside each CUDA object (make cuda-resources)
set -- "$B"/obj/cuda/*.o.ptxas
if [ "$build_ok" = 1 ] && [ -f "$1" ]; then
    run resources 60 "registers and spills per kernel (ptxas)" \
        env KVP_SPILL_GATE=report scripts/cuda-resources.sh "$@"
elif [ "$build_ok" = 1 ]; then
    skip resources "no ptxas report in $B/obj/cuda (no nvcc object built)"
else
    skip resources "$build_why"
fi

# The test binaries run the tests KVP_TEST_FILTER matches (cmocka's
# wildcards): the sanitizers then run one test at a time. Checked first.
filter_ok=0
t0=$(date +%s)
if [ "$build_ok" = 1 ]; then
    tb=$B/tests/test_cuda_sim
    [ "$gpu" = 1 ] && tb=$B/tests/test_cuda_gpu
    # the filter must select exactly one test, or the sanitizer steps run whole binaries
    if env KVP_TEST_FILTER=test_quantize_standalone timeout 60 "$tb" >"$out/logs/test-filter.log" 2>&1 &&
        grep -q '^\[==========\] 1 test(s) run' "$out/logs/test-filter.log"; then
        record test-filter PASS $(($(date +%s) - t0)) 0 "KVP_TEST_FILTER selects one test of $(basename "$tb")"
        filter_ok=1
    else
        record test-filter FAIL $(($(date +%s) - t0)) 1 "KVP_TEST_FILTER did not select one test: the sanitizers run whole binaries"
    fi
else
    skip test-filter "$build_why"
fi

# ---- 3. the CUDA test suite -------------------------------------------------------------
if [ "$gpu" != 1 ]; then
    skip device-info "$gpu_why"
elif [ "$build_ok" != 1 ]; then
    skip device-info "$build_why"
else
    run device-info 60 "tests/test_cuda_device: GPU discovery" "$B/tests/test_cuda_device"
fi
if [ "$build_ok" != 1 ]; then
    skip test-cuda "$build_why"
elif [ "$gpu" = 1 ] && ! wanted test-cuda; then
    skip test-cuda "not in KVP_GPU_CHECK_STEPS"
elif [ "$gpu" = 1 ]; then
    run test-cuda 180 "$B/tests/test_cuda_gpu: the backend vs the CPU, on the GPU" \
        scripts/run-tests.sh "$B/tests/test_cuda_gpu"
else
    skip test-cuda "$gpu_why"
    run test-cuda-sim 240 "$B/tests/test_cuda_sim: the same suite on the kernel simulator" \
        scripts/run-tests.sh "$B/tests/test_cuda_sim"
fi

# ---- 4. the copy bandwidth probe -------------------------------------------------------
# Independent of the library: cudaMemcpyAsync device to device, 1 GiB, 20
# times, timed with events (kvpage-bench's read_gbps measures the same way).
cat >"$out/copy_probe.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
int main() {
    const size_t bytes = (size_t)1 << 30;
    const int reps = 20;
    void *a, *b;
    cudaEvent_t e0, e1;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    double gbps = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    printf("{\"probe\": \"d2d_copy\", \"gpu\": \"%s\", \"bytes\": %zu, \"reps\": %d, "
           "\"ms\": %.3f, \"gbps_read_plus_write\": %.1f}\n", p.name, bytes, reps, ms, gbps);
    return 0;
}
EOF
if [ -z "$nvcc" ]; then
    skip copy-probe "nvcc not found"
elif [ "$gpu" = 1 ] && ! wanted copy-probe; then
    skip copy-probe "not in KVP_GPU_CHECK_STEPS"
elif [ "$gpu" = 1 ]; then
    run copy-probe 90 "device-to-device copy, 1 GiB x 20 (read + write GB/s)" \
        sh -c "\"$nvcc\" -O2 -arch=sm_$arch -o \"$out/copy_probe\" \"$out/copy_probe.cu\" && \"$out/copy_probe\""
    grep '^{' "$out/logs/copy-probe.log" >"$out/copy_probe.jsonl" 2>/dev/null || true
else
    # compiled, so a broken probe shows here already; not run
    probe_arch=${archs##* }
    [ -n "$probe_arch" ] || probe_arch=$("$make" --no-print-directory -s HAVE_CUDA=1 BUILD_ROOT="$root" \
        --eval 'kvp-gpu-check-archs: ; @echo $(lastword $(CUDA_ARCHS))' kvp-gpu-check-archs 2>/dev/null)
    run copy-probe-build 120 "compiled for sm_${probe_arch:-80}, not run: $gpu_why" \
        "$nvcc" -O2 -arch=sm_"${probe_arch:-80}" -o "$out/copy_probe" "$out/copy_probe.cu"
    skip copy-probe "$gpu_why"
fi

# ---- 5. the attention benchmark ---------------------------------------------------------
bench_cases() { for b in 1 64; do for c in 8k 32k; do for f in fp16 int8 int4; do echo "$b $c $f"; done; done; done; }
if [ "$gpu" != 1 ]; then
    skip bench "$gpu_why"
elif ! wanted bench; then
    skip bench "not in KVP_GPU_CHECK_STEPS"
elif [ "$build_ok" != 1 ]; then
    skip bench "$build_why"
else
    t0=$(date +%s)
    : >"$out/logs/bench.log"
    bench_failed=0
    bench_skipped=0
    bench_ran=0
    bench_cap=180 # the whole step, so that the sanitizers get their turn
    bench_cases | while read -r b c f; do
        remain=$(left)
        step_left=$((bench_cap - ($(date +%s) - t0)))
        [ "$remain" -gt "$step_left" ] && remain=$step_left
        if [ "$remain" -lt 20 ]; then
            printf '{"batch": %s, "context": "%s", "format": "%s", "rc": null, "note": "out of time (budget or the step cap, 180 s)", "result": null}\n' \
                "$b" "$c" "$f" >>"$out/bench.jsonl"
            continue
        fi
        limit=90
        [ "$limit" -gt "$remain" ] && limit=$remain
        log=$out/logs/bench-b$b-c$c-$f.log
        echo "\$ $B/bin/kvpage-bench attention --device cuda --batch $b --context $c --format $f" >"$log"
        timeout -k 10 "$limit" "$B/bin/kvpage-bench" attention --device cuda --batch "$b" --context "$c" \
            --format "$f" >>"$log" 2>&1 </dev/null
        r=$?
        grep '^{' "$log" >>"$out/bench-raw.jsonl"
        j=$(grep '^{' "$log" | tail -n 1)
        note=""
        [ "$r" -eq 124 ] || [ "$r" -eq 137 ] && note="stopped after $limit s"
        [ "$r" -ne 0 ] && [ -z "$note" ] && note=$(grep -v '^\$ ' "$log" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-160)
        printf '{"batch": %s, "context": "%s", "format": "%s", "rc": %s, "note": "%s", "result": %s}\n' \
            "$b" "$c" "$f" "$r" "$(json_str "$note")" "${j:-null}" >>"$out/bench.jsonl"
        printf 'batch %-3s context %-4s %-5s rc %s%s\n' "$b" "$c" "$f" "$r" "${note:+: $note}" >>"$out/logs/bench.log"
        cat "$log" >>"$out/logs/bench.log"
    done
    bench_ran=$(grep -c '"rc": [0-9]' "$out/bench.jsonl")
    bench_failed=$(grep -c '"rc": [1-9]' "$out/bench.jsonl")
    bench_skipped=$(grep -c '"rc": null' "$out/bench.jsonl")
    st=PASS
    [ "$bench_failed" -gt 0 ] && st=FAIL
    [ "$bench_ran" -eq 0 ] && st=SKIPPED
    record bench "$st" $(($(date +%s) - t0)) "$bench_failed" \
        "kvpage-bench attention --device cuda: $bench_ran of 12 cases ran, $bench_failed failed, $bench_skipped not run (out of time); bench.jsonl"
fi

# ---- 6. compute-sanitizer on small cases ---------------------------------------------------
sanitizer=$(command -v compute-sanitizer 2>/dev/null)
for d in "$cuda_home" /usr/local/cuda /opt/nvidia/compute-sanitizer; do
    [ -z "$sanitizer" ] && [ -n "$d" ] && [ -x "$d/bin/compute-sanitizer" ] && sanitizer=$d/bin/compute-sanitizer
    [ -z "$sanitizer" ] && [ -n "$d" ] && [ -x "$d/compute-sanitizer" ] && sanitizer=$d/compute-sanitizer
done
# the smallest tests that cover append, page operations, quantization and
# attention (every format; split-KV and the merge)
memcheck_tests="test_append_bytes test_ops_read_and_swap test_quantize_standalone test_attention_formats test_attention_ragged_and_splits"
racecheck_tests="test_attention_formats test_attention_ragged_and_splits test_append_bytes"
sanitize() { # TOOL STEP_LIMIT TESTS: each test a run of its own, all within STEP_LIMIT
    local tool=$1 limit=$2 tests=$3 step=$1 t0 t1 ran=0 bad=0 r remain l note="" unrun=""
    if ! wanted "$step"; then skip "$step" "not in KVP_GPU_CHECK_STEPS"; return; fi
    if [ "$gpu" != 1 ]; then skip "$step" "$gpu_why"; return; fi
    if [ "$build_ok" != 1 ]; then skip "$step" "$build_why"; return; fi
    if [ -z "$sanitizer" ]; then skip "$step" "compute-sanitizer not found (PATH, \$CUDA_HOME/bin)"; return; fi
    t0=$(date +%s)
    echo "\$ $sanitizer --tool $tool --error-exitcode 99 $B/tests/test_cuda_gpu (KVP_TEST_FILTER per test)" \
        >"$out/logs/$step.log"
    [ "$filter_ok" = 1 ] || tests=ALL
    for t in $tests; do
        remain=$(left)
        l=$((limit - ($(date +%s) - t0)))
        [ "$l" -gt "$remain" ] && l=$remain
        if [ "$l" -lt 10 ]; then
            echo "== $t: not run, out of time" >>"$out/logs/$step.log"
            unrun="$unrun $t"
            continue
        fi
        echo "== $t (timeout $l s)" >>"$out/logs/$step.log"
        if [ "$t" = ALL ]; then
            timeout -k 10 "$l" "$sanitizer" --tool "$tool" --error-exitcode 99 \
                "$B/tests/test_cuda_gpu" >>"$out/logs/$step.log" 2>&1 </dev/null
        else
            timeout -k 10 "$l" env KVP_TEST_FILTER="$t" "$sanitizer" --tool "$tool" \
                --error-exitcode 99 "$B/tests/test_cuda_gpu" >>"$out/logs/$step.log" 2>&1 </dev/null
        fi
        r=$?
        echo "== $t: exit $r" >>"$out/logs/$step.log"
        ran=$((ran + 1))
        if [ "$r" -ne 0 ]; then
            bad=$((bad + 1))
            case $r in 99) why="sanitizer errors" ;; 124 | 137) why="timeout" ;; *) why="test failed" ;; esac
            note="${note:+$note, }$t (exit $r: $why)"
        fi
    done
    t1=$(date +%s)
    if [ "$ran" -eq 0 ]; then
        record "$step" SKIPPED $((t1 - t0)) null "out of time (budget or the step cap, $limit s); not run:$unrun"
        return
    fi
    [ -n "$unrun" ] && unrun="; not run (out of time):$unrun"
    if [ "$bad" -eq 0 ]; then
        if [ "$tests" = ALL ]; then tests="the whole binary (no test filter)"; else tests="$ran test(s) run one by one"; fi
        record "$step" PASS $((t1 - t0)) 0 "$tool clean: $tests$unrun"
    else
        record "$step" FAIL $((t1 - t0)) 1 "$tool: $note$unrun"
    fi
}
sanitize memcheck 120 "$memcheck_tests"
sanitize racecheck 150 "$racecheck_tests"

# ---- summary ---------------------------------------------------------------------------
total=$(($(date +%s) - t_start))
{
    printf '%-22s %-9s %8s  %s\n' step status seconds note
    awk -F'\t' '{ printf "%-22s %-9s %8s  %s\n", $1, $2, $3, $4 }' "$out/summary.rows"
    printf '%-22s %-9s %8s  %s\n' total "" "$total" "$(grep -c . "$out/summary.rows") steps; budget $budget s; $([ "$gpu" = 1 ] && echo "GPU sm_$arch" || echo "no GPU: $gpu_why")"
} >"$out/summary.txt"
rm -f "$out/summary.rows"
echo
echo "gpu-check: summary ($out/summary.txt)"
cat "$out/summary.txt"
if grep -q '"status": "\(FAIL\|TIMEOUT\)"' "$out/steps.jsonl"; then
    echo "gpu-check: some steps FAILED or TIMED OUT (logs in $out/logs)"
    exit 1
fi
echo "gpu-check: no step failed"
exit 0
