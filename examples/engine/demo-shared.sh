#!/bin/sh
# `make demo-shared`: KV shared through a Redis server. A redis-server of the
# demo's own is started on a free loopback port (--save "" --appendonly no
# --maxmemory 1gb --maxmemory-policy allkeys-lru, a random password), then
# the engine's demo runs three times, one process after the other, over the
# same prompts, which share a document of ~2,100 tokens (the first three
# sections of GPL-3, as in `make demo-store`):
#   run 1  without any KV store (the reference text);
#   run 2  --kv-store redis://127.0.0.1:PORT, the server empty (cold): it
#          prefills the document and its pages go to the server;
#   run 3  the same store (warm): another process finds the document's pages
#          on the server instead of prefilling them.
# The engine gets the password from KVPAGE_REDIS_PASSWORD (never on its
# command line) and the key prefix from KVPAGE_REDIS_PREFIX. Printed: the
# runs, then run 3's tokens found remotely and its time to first token
# against run 2's, and whether the greedy text of the three runs is the
# same; the last line is one JSON object. The server is stopped on every
# exit (a bounded wait, then SIGKILL).
#
#   demo-shared.sh ENGINE MODEL [KV]     KV: the cache's format (default int8)
#
#   KVPAGE_DEMO_DOC      the document (default /usr/share/common-licenses/GPL-3;
#                        its first 194 lines are used)
#   KVPAGE_DEMO_TIMEOUT  seconds each run may take (default 600)
#   KVPAGE_DEMO_FAULT=1  then the server's failure, three runs more: run 4 over
#                        the same store, the server killed (SIGKILL) as soon as
#                        its first request has joined the batch: the engine goes
#                        on, its later lookups are misses (counted), its text
#                        is unchanged; the server restarted (empty), run 5
#                        fills it and run 6 finds the pages there again
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
fault=${KVPAGE_DEMO_FAULT:-0}

if [ ! -r "$doc" ]; then
    echo "demo-shared: $doc is missing (Debian's base-files ships it); set KVPAGE_DEMO_DOC to a text of 2,000+ tokens" >&2
    exit 1
fi

# redis-server (and redis-cli, which it depends on): installed if missing.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "demo-shared: redis-server is not installed — installing it with apt-get (Debian package redis-server)"
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
            echo "demo-shared: not root and no sudo; install redis-server as root and run again" >&2
            exit 1
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "demo-shared: apt-get not found; install redis-server with your package manager" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends redis-server >/tmp/kvpage-apt.log 2>&1 ||
        { $sudo apt-get update >>/tmp/kvpage-apt.log 2>&1 &&
          $sudo apt-get install -y --no-install-recommends redis-server >>/tmp/kvpage-apt.log 2>&1; }
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        echo "demo-shared: could not install redis-server (see /tmp/kvpage-apt.log)" >&2
        exit 1
    fi
    echo "demo-shared: installed redis-server ($(redis-server --version | cut -d' ' -f1-3))"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpage-demo-shared.XXXXXX") || exit 1
chmod 700 "$tmp"
server_pid=""
port=""
password=kvpage-demo-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')

# Running: not exited and not a zombie (our child until it is reaped).
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    if [ -r "/proc/$1/stat" ]; then
        [ "$(sed 's/^.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null)" != Z ] || return 1
    fi
    return 0
}

# Stop the server: SIGTERM (nothing to save), at most 5 s, then SIGKILL.
stop_server() {
    [ -n "$server_pid" ] || return 0
    kill -TERM "$server_pid" 2>/dev/null
    i=0
    while alive "$server_pid" && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    alive "$server_pid" && kill -KILL "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=""
}

cleanup() {
    stop_server
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rcli() { REDISCLI_AUTH=$password redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null; }

# The password is in a config file of mode 600, not on a command line.
printf 'requirepass "%s"\n' "$password" >"$tmp/redis.conf"
chmod 600 "$tmp/redis.conf"

# Start redis-server on $port; 0 once it answers PING (within 10 s).
start_server() {
    redis-server "$tmp/redis.conf" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --maxmemory 1gb --maxmemory-policy allkeys-lru --dir "$tmp" --logfile "$tmp/redis.log" \
        --daemonize no >/dev/null 2>&1 &
    server_pid=$!
    i=0
    while [ $i -lt 100 ]; do
        if [ "$(rcli ping)" = PONG ] && alive "$server_pid"; then
            return 0
        fi
        if ! alive "$server_pid"; then # e.g. the port was taken meanwhile
            wait "$server_pid" 2>/dev/null
            server_pid=""
            return 1
        fi
        sleep 0.1
        i=$((i + 1))
    done
    stop_server
    return 1
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
        2>/dev/null || awk -v seed="$$$(date +%N 2>/dev/null)" 'BEGIN { srand(seed % 100000); print 20000 + int(rand() * 40000) }'
}

for _ in 1 2 3 4 5 6 7 8; do
    port=$(free_port)
    # something answers there already: another port
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && continue
    start_server && break
    port=""
done
if [ -z "$port" ]; then
    echo "demo-shared: redis-server did not start (log: $(tail -n 3 "$tmp/redis.log" 2>/dev/null))" >&2
    exit 1
fi
store="redis://127.0.0.1:$port"
echo "demo-shared: $(redis-server --version | cut -d' ' -f1-3) on 127.0.0.1:$port (pid $server_pid; --save \"\"" \
    "--appendonly no --maxmemory 1gb --maxmemory-policy allkeys-lru; a password, given to the engine in" \
    "KVPAGE_REDIS_PASSWORD)"
echo

{
    printf 'Answer questions about the license text below, briefly.\n\n'
    head -n 194 "$doc"
} >"$tmp/document.txt"

# One request at a time, so the first one prefills the document alone and
# its time to first token is the document's prefill (cold) or its read from
# the server (warm).
set -- --system-file "$tmp/document.txt" --max-active 1 --max-tokens 24 --kv "$kv" \
    --prompt "What is this document? Answer in one sentence." \
    --prompt "May I sell copies of a program under this license?" \
    --prompt "What does it mean to convey a work?"
export KVPAGE_REDIS_PASSWORD="$password" KVPAGE_REDIS_PREFIX="kvpage-demo:"

# run NAME N TITLE [--kv-store SPEC]: the demo in the foreground, its output printed.
run() {
    name=$1 n=$2 title=$3
    shift 3
    echo "==== run $n ($title)"
    timeout -k 10 "$limit" "$engine" demo "$model" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    cat "$tmp/$name.out"
    if [ $rc -ne 0 ]; then
        cat "$tmp/$name.err" >&2
        [ $rc -eq 124 ] && echo "demo-shared: run $n took more than ${limit} s" >&2
        echo "demo-shared: run $n failed (exit $rc)" >&2
        exit 1
    fi
    echo
}

# A field of a run's last line (the demo's JSON summary).
field() { tail -n 1 "$tmp/$2.out" | sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }
answers() { sed -n '/^answers:$/,/^$/p' "$tmp/$1.out" >"$tmp/$1.answers"; }
same() { # run run: the same greedy text
    [ -s "$tmp/$1.answers" ] && cmp -s "$tmp/$1.answers" "$tmp/$2.answers" && return 0
    echo "demo-shared: the greedy text differs between the runs ($1, $2):" >&2
    diff "$tmp/$1.answers" "$tmp/$2.answers" >&2
    return 1
}

run ref 1 "kvpage-engine demo, no KV store: the reference text" "$@"
run cold 2 "kvpage-engine demo, KV store $store, the server empty" "$@" --kv-store "$store"
keys=$(rcli dbsize)
mem=$(rcli info memory | sed -n 's/^used_memory_human:\([^[:space:]]*\).*/\1/p')
run warm 3 "kvpage-engine demo, another process over the same KV store $store ($keys keys there)" "$@" \
    --kv-store "$store"
for r in ref cold warm; do answers $r; done
identical=true
same ref cold || identical=false
same ref warm || identical=false

hit=$(field remote_hit_tokens warm)
pool=$(field pool_hit_tokens warm)
prompt=$(field prompt_tokens warm)
cold=$(field ttft_ms_first cold)
warm=$(field ttft_ms_first warm)
if [ -z "$hit" ] || [ -z "$prompt" ] || [ -z "$cold" ] || [ -z "$warm" ]; then
    echo "demo-shared: cannot read the demo's JSON summary" >&2
    exit 1
fi

fault_json=""
fault_ok=true
if [ "$fault" = 1 ]; then
    # run 4 in the background; the server is killed once its first request
    # has joined (its document then came from the server)
    echo "==== run 4 (kvpage-engine demo over $store; the server killed with SIGKILL as soon as request 1 has joined)"
    timeout -k 10 "$limit" "$engine" demo "$model" "$@" --kv-store "$store" >"$tmp/fault.out" 2>"$tmp/fault.err" &
    epid=$!
    while alive "$epid" && ! grep -q '^  \[1\] joins the batch' "$tmp/fault.out" 2>/dev/null; do sleep 0.02; done
    killed=no
    if alive "$epid"; then
        kill -KILL "$server_pid" 2>/dev/null && killed=yes
        wait "$server_pid" 2>/dev/null
        server_pid=""
    fi
    wait "$epid"
    rc=$?
    sed 's/^  \[1\] joins the batch.*/&   <-- the server is killed here (SIGKILL)/' "$tmp/fault.out"
    if [ $rc -ne 0 ] || [ $killed = no ]; then
        cat "$tmp/fault.err" >&2
        echo "demo-shared: run 4 failed (exit $rc; server killed: $killed)" >&2
        exit 1
    fi
    echo
    answers fault
    f_identical=true
    same ref fault || f_identical=false
    f_hit=$(field remote_hit_tokens fault)
    f_miss=$(field store_misses fault)
    f_fail=$(field redis_failures fault)
    f_skip=$(field redis_skipped fault)
    # restarted, empty: run 5 fills it, run 6 finds the pages there again
    if ! start_server; then
        echo "demo-shared: redis-server did not restart on port $port" >&2
        exit 1
    fi
    echo "demo-shared: redis-server restarted on 127.0.0.1:$port (pid $server_pid; empty: nothing was saved)"
    echo
    run refill 5 "kvpage-engine demo over the restarted server $store" "$@" --kv-store "$store"
    run again 6 "kvpage-engine demo, another process over the restarted server $store" "$@" --kv-store "$store"
    answers refill
    answers again
    same ref refill || f_identical=false
    same ref again || f_identical=false
    r_hit=$(field remote_hit_tokens again)
    echo "==== the server's failure"
    echo "run 4: $f_hit prompt tokens found remotely before the server was killed; then $f_miss pages missed" \
        "($f_fail connection failures, $f_skip keys skipped while it was down); the run finished (exit 0)" \
        "with the reference text: $([ $f_identical = true ] && echo yes || echo NO)"
    echo "runs 5-6: after the restart run 6 found $r_hit prompt tokens on the server again"
    [ "$f_identical" = true ] && [ "${f_miss:-0}" -gt 0 ] && [ $((${f_fail:-0} + ${f_skip:-0})) -gt 0 ] &&
        [ "${r_hit:-0}" -gt 0 ] || fault_ok=false
    echo
    fault_json=$(printf ', "fault_misses": %d, "fault_failures": %d, "fault_skipped": %d, "restart_hit_tokens": %d, "fault_identical": %s' \
        "${f_miss:-0}" "${f_fail:-0}" "${f_skip:-0}" "${r_hit:-0}" "$f_identical")
fi

echo "==== run 3 against run 2"
awk -v hit="$hit" -v pool="$pool" -v prompt="$prompt" -v cold="$cold" -v warm="$warm" -v same="$identical" \
    -v keys="${keys:-?}" -v mem="${mem:-?}" -v extra="$fault_json" 'BEGIN {
    ratio = warm > 0 ? cold / warm : 0
    printf "run 3 found %d of its %d prompt tokens on the Redis server (%s keys, %s used, after run 2),\n", hit, prompt, keys, mem
    printf "and %d in its pool (the pages its first request brought in, shared by the others); first request'\''s\n", pool
    printf "time to first token: %.1f ms (run 2, cold: the document prefilled) -> %.1f ms (run 3, warm: read from\n", cold, warm
    printf "the server), %.1fx sooner; greedy text with and without the store %s\n", ratio, same == "true" ? "identical" : "DIFFERENT"
    printf "{\"remote_hit_tokens\": %d, \"prompt_tokens\": %d, \"ttft_ms_cold\": %.1f, \"ttft_ms_warm\": %.1f, \"ttft_ratio\": %.2f, \"identical\": %s%s}\n", hit, prompt, cold, warm, ratio, same, extra
}'
[ "$identical" = true ] && [ "$hit" -gt 0 ] && [ "$fault_ok" = true ]
