#!/bin/sh
# Registers, shared memory, spills and stack of every CUDA kernel, per arch,
# as ptxas reports them, and a gate: exit 1 when a decode attention kernel
# (cuda/attention.cuh: k_attention, k_attention_pipe, and the split-KV merge
# k_merge) spills
# registers to local memory.
#
#   make cuda-resources                                (the library's objects)
#   scripts/cuda-resources.sh [--markdown] LOG...
#
# The Makefile compiles every cuda/*.cu with -Xptxas -v and keeps ptxas's
# report beside the object (build/obj/cuda/FILE.o.ptxas, every arch of
# CUDA_ARCHS in one file): the figures are those of the code the library
# ships, and reading them costs no compile. `make cuda-resources` builds what
# is out of date, then runs this script on those reports.
#
# Environment:
#   KVP_SPILL_GATE=fail    (default) exit 1 when a decode attention kernel spills
#   KVP_SPILL_GATE=report  print the same table and verdict, exit 0
#   KVP_SPILL_KERNELS      extended regex for the gated kernels ('^(k_attention|k_attention_pipe|k_merge)<')
set -eu

markdown=0
logs=""
for a in "$@"; do
    case "$a" in
    --markdown) markdown=1 ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "cuda-resources: unknown option '$a' (see --help)" >&2; exit 2 ;;
    *)
        [ -f "$a" ] || { echo "cuda-resources: no ptxas report $a (built before the Makefile kept them? make clean)" >&2; exit 2; }
        logs="$logs $a"
        ;;
    esac
done
[ -n "$logs" ] || { echo "cuda-resources: no ptxas report given (see --help)" >&2; exit 2; }

gate=${KVP_SPILL_GATE:-fail}
case "$gate" in fail | report) ;; *)
    echo "cuda-resources: KVP_SPILL_GATE must be 'fail' or 'report', not '$gate'" >&2; exit 2 ;;
esac
gated=${KVP_SPILL_KERNELS:-'^(k_attention|k_attention_pipe|k_merge)<'}

# ptxas -v, per function and arch:
#   ptxas info    : Compiling entry function '_Z...' for 'sm_90'
#   ptxas info    : Function properties for _Z...
#       24 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads
#   ptxas info    : Used 168 registers, used 1 barriers, 19456 bytes smem, 400 bytes cmem[0]
# One row per entry function: arch, mangled name, regs, smem, spill stores, spill loads, stack
rows=$(cat $logs | awk '
    function flush() { if (fn != "") print arch "\t" fn "\t" regs "\t" smem "\t" st "\t" ld "\t" stack; fn = "" }
    /Compiling entry function/ {
        flush()
        fn = $0; sub(/.*entry function \047/, "", fn); sub(/\047.*/, "", fn)
        arch = $0; sub(/.*for \047/, "", arch); sub(/\047.*/, "", arch)
        regs = 0; smem = 0; st = 0; ld = 0; stack = 0; props = 0
        next
    }
    /Function properties for / { props = (fn != "" && index($0, fn) > 0); next }
    /bytes stack frame/ && props {
        for (i = 1; i < NF; i++) {
            if ($(i + 1) == "bytes" && $(i + 2) == "stack") stack = $i
            if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^stores/) st = $i
            if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^loads/) ld = $i
        }
        next
    }
    /Used [0-9]+ registers/ && fn != "" {
        for (i = 1; i < NF; i++) {
            if ($(i + 1) ~ /^registers/) regs = $i
            if ($(i + 1) == "bytes" && $(i + 2) ~ /^smem/) smem = $i
        }
        flush()
    }
    END { flush() }')

if [ -z "$rows" ]; then
    echo "cuda-resources: ptxas reported no kernel in$logs" >&2
    exit 2
fi

# Readable names: demangled, without the return type, parameters and namespaces:
#   void kvp::cuda::k_attention<128, 4>(kvp::cuda::params)  ->  k_attention<128,4>
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' "$rows" >"$tmp/rows"
demangle=c++filt
command -v c++filt >/dev/null 2>&1 || demangle="cat"
cut -f2 "$tmp/rows" | $demangle | sed -e 's/^void //' -e 's/(anonymous namespace):://g' -e 's/(.*)$//' \
    -e 's/[A-Za-z_][A-Za-z0-9_]*:://g' -e 's/, /,/g' >"$tmp/names"
table=$(paste "$tmp/rows" "$tmp/names" |
    awk -F'\t' '{ print $1 "\t" $8 "\t" $3 "\t" $4 "\t" $5 "\t" $6 "\t" $7 }' |
    sort -t"$(printf '\t')" -k1,1 -k2,2V)

if [ "$markdown" = 1 ]; then
    echo "| arch | kernel | registers | static smem (B) | spill stores (B) | spill loads (B) | stack (B) |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    printf '%s\n' "$table" | awk -F'\t' '{ printf "| %s | `%s` | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
else
    printf '%-6s %-28s %9s %12s %13s %12s %10s\n' arch kernel registers "smem B" "spill st B" "spill ld B" "stack B"
    printf '%s\n' "$table" | awk -F'\t' '{ printf "%-6s %-28s %9s %12s %13s %12s %10s\n", $1, $2, $3, $4, $5, $6, $7 }'
fi

# The gate: decode attention kernels must not spill.
ngated=$(printf '%s\n' "$table" | awk -F'\t' -v re="$gated" '$2 ~ re' | wc -l)
spills=$(printf '%s\n' "$table" | awk -F'\t' -v re="$gated" '$2 ~ re && ($5 > 0 || $6 > 0) {
    printf "  %s %s: %s B spill stores, %s B spill loads (%s registers)\n", $1, $2, $5, $6, $3 }')
echo
if [ "$ngated" -eq 0 ]; then
    case " $logs " in
    */attention*.o.ptxas*)
        echo "cuda-resources: no decode attention kernel matches '$gated' in ptxas's output: renamed? (KVP_SPILL_KERNELS)" >&2
        exit 1 ;;
    *)
        echo "cuda-resources: no decode attention kernel in these reports: spill gate not applied"
        exit 0 ;;
    esac
fi
if [ -z "$spills" ]; then
    echo "cuda-resources: no spills in the $ngated decode attention kernels (gate '$gated', $gate)"
    exit 0
fi
nspill=$(printf '%s\n' "$spills" | wc -l)
echo "cuda-resources: $nspill of $ngated decode attention kernels spill registers to local memory:"
printf '%s\n' "$spills"
if [ "$gate" = report ]; then
    echo "cuda-resources: KVP_SPILL_GATE=report: reported, not failed"
    exit 0
fi
echo "cuda-resources: FAILED: decode attention kernels must not spill (KVP_SPILL_GATE=report to only report)" >&2
exit 1
