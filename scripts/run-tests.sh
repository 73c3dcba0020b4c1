#!/bin/sh
# Run test programs (cmocka), then print one summary in cmocka's style.
# Exits non-zero if any program fails. TEST_WRAPPER, if set, is the
# command each program runs under (e.g. "qemu-aarch64"); TEST_TIMEOUT, in
# seconds, bounds each program (timeout(1); exit 124 when it runs past);
# TEST_JOBS (default 1) programs run at once (each program's output is
# printed whole, in the order given, once all have run; list the longest
# first).
set -u

jobs=${TEST_JOBS:-1}

if [ "${SAN:-0}" = 1 ]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:protect_shadow_gap=0}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi

# run_one DIR INDEX PROGRAM: its output in DIR/INDEX.log, its status in .rc,
# its wall time (whole seconds) in .sec
run_one() {
    t0=$(date +%s)
    # shellcheck disable=SC2086
    if [ -n "${TEST_TIMEOUT:-}" ]; then
        timeout "$TEST_TIMEOUT" ${TEST_WRAPPER:-} "$3" >"$1/$2.log" 2>&1
    else
        ${TEST_WRAPPER:-} "$3" >"$1/$2.log" 2>&1
    fi
    echo $? >"$1/$2.rc"
    echo $(($(date +%s) - t0)) >"$1/$2.sec"
}

# (how the parallel runs call back: "$0" --one DIR INDEX PROGRAM)
if [ "${1:-}" = "--one" ]; then
    run_one "$2" "$3" "$4"
    exit 0
fi

outdir=$(mktemp -d)
trap 'rm -rf "$outdir"' EXIT
if [ "$jobs" -gt 1 ]; then
    i=0
    for t in "$@"; do
        i=$((i + 1))
        printf '%s %s\n' "$i" "$t"
    done | xargs -P "$jobs" -n 2 "$0" --one "$outdir"
fi

programs=0
run=0
skipped=0
failed_tests=0
failed_programs=""
times=""
for t in "$@"; do
    programs=$((programs + 1))
    [ "$jobs" -gt 1 ] || run_one "$outdir" "$programs" "$t"
    log="$outdir/$programs.log"
    rc=$(cat "$outdir/$programs.rc" 2>/dev/null || echo 127)
    cat "$log"
    sec=$(cat "$outdir/$programs.sec" 2>/dev/null || echo 0)
    echo "---- $t: $sec s"
    times="$times$sec $(basename "$t")
"
    n=$(sed -n 's/^\[==========\] \([0-9][0-9]*\) test(s) run\..*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9][0-9]*\) test(s), listed below:.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    k=$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) test(s), listed below:.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    run=$((run + n))
    skipped=$((skipped + k))
    failed_tests=$((failed_tests + f))
    if [ "$rc" -ne 0 ]; then
        failed_programs="$failed_programs $(basename "$t")(exit $rc)"
        [ "$f" -eq 0 ] && failed_tests=$((failed_tests + 1))
    fi
done

echo
echo "longest programs (s): $(printf '%s' "$times" | sort -rn | head -n 5 | tr '\n' ' ')"
echo "[==========] $run test(s) run in $programs program(s)."
# cmocka counts a skipped test as run; so does this summary, but never as passed
[ "$skipped" -gt 0 ] && echo "[  SKIPPED ] $skipped test(s) (see the reasons above)."
if [ -z "$failed_programs" ]; then
    echo "[  PASSED  ] $((run - skipped)) test(s)."
    exit 0
fi
passed=$((run - skipped - failed_tests))
[ "$passed" -lt 0 ] && passed=0 # a program that failed before running any test
echo "[  PASSED  ] $passed test(s)."
echo "[  FAILED  ] $failed_tests test(s) in:$failed_programs"
exit 1
