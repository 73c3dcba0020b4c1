#!/bin/sh
# `make demo-store`: KV leaving the process. The engine's demo runs twice,
# one process after the other, over the same prompts, which share a document
# of ~2,100 tokens (the first three sections of GPL-3, the text `make eval`
# uses) in their system prompt, with one fresh KV store directory
# (--kv-store dir:...). The first run (cold, empty store) prefills the
# document and writes its pages to the store; the second (warm) finds them
# there and prefills only the question. Both runs are printed, then the
# second's tokens found in the store and time to first token against the
# first's, and whether the greedy text is the same; the last line is one
# JSON object.
#
#   demo-store.sh ENGINE MODEL [KV]     KV: the cache's format (default int8)
#
#   KVPAGE_DEMO_DOC      the document (default /usr/share/common-licenses/GPL-3;
#                        its first 194 lines are used)
#   KVPAGE_DEMO_TIMEOUT  seconds each run may take (default 600)
set -u

if [ $# -lt 2 ]; then
    echo "usage: $0 ENGINE MODEL [KV]" >&2
    exit 2
fi
engine=$1
model=$2
kv=${3:-int8}
doc=${KVPAGE_DEMO_DOC:-/usr/share/common-licenses/GPL-3}
limit=${KVPAGE_DEMO_TIMEOUT:-600}

if [ ! -r "$doc" ]; then
    echo "demo-store: $doc is missing (Debian's base-files ships it); set KVPAGE_DEMO_DOC to a text of 2,000+ tokens" >&2
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpage-demo-store.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

{
    printf 'Answer questions about the license text below, briefly.\n\n'
    head -n 194 "$doc"
} >"$tmp/document.txt"

# One request at a time, so the first one prefills the document alone and
# its time to first token is the document's prefill (cold) or store read (warm).
set -- --system-file "$tmp/document.txt" --max-active 1 --max-tokens 24 --kv "$kv" \
    --kv-store "dir:$tmp/store" \
    --prompt "What is this document? Answer in one sentence." \
    --prompt "May I sell copies of a program under this license?" \
    --prompt "What does it mean to convey a work?"

n=0
for run in cold warm; do
    n=$((n + 1))
    echo "==== run $n ($run): kvpage-engine demo, KV store dir:$tmp/store$([ $run = cold ] && echo ' (empty)')"
    timeout "$limit" "$engine" demo "$model" "$@" >"$tmp/$run.out" 2>"$tmp/$run.err"
    rc=$?
    cat "$tmp/$run.out"
    if [ $rc -ne 0 ]; then
        cat "$tmp/$run.err" >&2
        [ $rc -eq 124 ] && echo "demo-store: run $n took more than ${limit} s" >&2
        echo "demo-store: run $n failed (exit $rc)" >&2
        exit 1
    fi
    echo
done

# A field of the demo's last line (its JSON summary).
field() { tail -n 1 "$tmp/$2.out" | sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }
answers() { sed -n '/^answers:$/,/^$/p' "$tmp/$1.out"; }

answers cold >"$tmp/cold.answers"
answers warm >"$tmp/warm.answers"
if [ -s "$tmp/cold.answers" ] && cmp -s "$tmp/cold.answers" "$tmp/warm.answers"; then
    identical=true
else
    identical=false
    echo "demo-store: the greedy text differs between the runs:" >&2
    diff "$tmp/cold.answers" "$tmp/warm.answers" >&2
fi
hit=$(field store_hit_tokens warm)
pool=$(field pool_hit_tokens warm)
prompt=$(field prompt_tokens warm)
cold=$(field ttft_ms_first cold)
warm=$(field ttft_ms_first warm)
if [ -z "$hit" ] || [ -z "$prompt" ] || [ -z "$cold" ] || [ -z "$warm" ]; then
    echo "demo-store: cannot read the demo's JSON summary" >&2
    exit 1
fi
echo "==== run 2 against run 1"
awk -v hit="$hit" -v pool="$pool" -v prompt="$prompt" -v cold="$cold" -v warm="$warm" -v same="$identical" 'BEGIN {
    printf "run 2 found %d of its %d prompt tokens in the KV store (and %d in the pool: the pages its first\n", hit, prompt, pool
    printf "request brought in from the store, shared by the others); first request'\''s time to first token:\n"
    printf "%.1f ms (run 1, cold: the document prefilled) -> %.1f ms (run 2, warm: read from the store), %.1fx sooner;\n", cold, warm, (warm > 0 ? cold / warm : 0)
    printf "greedy text of the two runs %s\n", same == "true" ? "identical" : "DIFFERENT"
    printf "{\"store_hit_tokens\": %d, \"prompt_tokens\": %d, \"ttft_ms_cold\": %.1f, \"ttft_ms_warm\": %.1f, \"identical\": %s}\n", hit, prompt, cold, warm, same
}'
[ "$identical" = true ] && [ "$hit" -gt 0 ]
