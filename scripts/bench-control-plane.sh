#!/usr/bin/env bash
# The control plane's speed (docs/benchmarks.md, "Control plane"): for each binary given, alternating between them
# round by round so that every binary sees the same machine load,
#   - gRPC `loragate.v1.LoraControl/WaitLoraUnpaused` (timeout 0) on an open adapter under h2load,
#   - HTTP `POST /skyrl/v1/wait_lora_unpaused` on an open adapter under wrk (1 thread, 32 connections),
#   each without and with keys configured (`--api-key`, `--admin-key`; the calls present the API key),
#   - and the time from a resume until 1,000 HTTP long-polls on the paused adapter are answered (without keys).
# Each figure is printed with the load average when it was taken.
#
# Usage: scripts/bench-control-plane.sh [BINARY ...]
#   Default: target/release/loragate (built first, with the profile of the README's server command).
#   Compare two builds: scripts/bench-control-plane.sh /tmp/loragate-main target/release/loragate
#   A build older than the server's `--state-dir` or `--api-key` flags (before issue 13, such as 6e30807) is started
#   without them: it is measured without keys only.
# Environment: ROUNDS (default 3), SECONDS_EACH (default 10), POLLS (default 1000), H2LOAD_CLIENTS (default 32),
#   H2LOAD_STREAMS (concurrent streams per connection, one h2load run per value; default "1 100").
# Needs h2load (Debian: nghttp2-client) and wrk (Debian: wrk).
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
SECONDS_EACH="${SECONDS_EACH:-10}"
POLLS="${POLLS:-1000}"
H2LOAD_CLIENTS="${H2LOAD_CLIENTS:-32}"
H2LOAD_STREAMS="${H2LOAD_STREAMS:-1 100}"
API_KEY="bench-api-key"
ADMIN_KEY="bench-admin-key"

for tool in h2load wrk curl python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y nghttp2-client wrk)" >&2; exit 1; }
done
if [ "$#" -eq 0 ]; then
    cargo build --release --locked -p loragate --bin loragate
    set -- target/release/loragate
fi
cargo build --release --locked -p loragate-control-plane-bench
WAKE=target/release/wake-long-polls

work="$(mktemp -d)"
server_pid=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap 'stop_server; rm -rf "$work"' EXIT

# WaitLoraUnpausedRequest { lora_name: "meow" } (timeout_s 0, the default), as one uncompressed gRPC frame.
printf '\x00\x00\x00\x00\x06\x0a\x04meow' >"$work/wait.grpc"
cat >"$work/wait.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"lora_name":"meow","timeout_s":0}'
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("BENCH_KEY")
if key ~= nil and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end
LUA

load() { cut -d' ' -f1-3 /proc/loadavg; }

# serves_flag BINARY FLAG: whether `BINARY serve` knows FLAG (older builds lack --state-dir and --api-key).
serves_flag() {
    "$1" serve --help 2>/dev/null | grep -q -- "$2"
}

# start_server BINARY [ARGS...]: starts `BINARY serve` on free ports, sets GRPC and HTTP from its ready line.
start_server() {
    local binary="$1"
    shift
    local state=()
    serves_flag "$binary" --state-dir && state=(--state-dir "$(mktemp -d -p "$work")")
    "$binary" serve "${state[@]}" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 "$@" \
        >"$work/ready" 2>"$work/server.log" &
    server_pid=$!
    for _ in $(seq 1200); do
        [ -s "$work/ready" ] && break
        kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
        sleep 0.1
    done
    GRPC="$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["grpc_addr"])' "$work/ready")"
    HTTP="$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["http_addr"])' "$work/ready")"
}

# The grpc-status of one call (h2load counts HTTP statuses only; a refused gRPC call is HTTP 200 too). It comes in
# the trailers, which curl prints with -v and h2load does not.
grpc_status() {
    local key="$1" auth=()
    [ -n "$key" ] && auth=(-H "authorization: Bearer $key")
    curl -sv --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' "${auth[@]}" \
        --data-binary "@$work/wait.grpc" -o /dev/null "http://$GRPC/loragate.v1.LoraControl/WaitLoraUnpaused" 2>&1 |
        grep -o 'grpc-status: [0-9]*' | head -n 1
}

grpc_rate() {
    local key="$1" streams="$2" auth=()
    [ -n "$key" ] && auth=(-H "authorization: Bearer $key")
    h2load -t 1 -c "$H2LOAD_CLIENTS" -m "$streams" -D "$SECONDS_EACH" --warm-up-time 1 \
        -H 'content-type: application/grpc' -H 'te: trailers' "${auth[@]}" -d "$work/wait.grpc" \
        "http://$GRPC/loragate.v1.LoraControl/WaitLoraUnpaused" >"$work/h2load.out" 2>&1 || true
    local rate failed
    rate="$(awk '/^finished in/ {print $4}' "$work/h2load.out")"
    failed="$(awk '/^requests:/ {print $10}' "$work/h2load.out")"
    echo "${rate:-?} req/s (failed: ${failed:-?}, answered $(grpc_status "$key"))"
}

http_rate() {
    local key="$1"
    BENCH_KEY="$key" wrk -t 1 -c 32 -d "${SECONDS_EACH}s" -s "$work/wait.lua" \
        "http://$HTTP/skyrl/v1/wait_lora_unpaused" >"$work/wrk.out" 2>&1 || true
    local rate errors
    rate="$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk.out")"
    errors="$(grep -E 'Non-2xx|Socket errors' "$work/wrk.out" | tr -s ' ' | tr '\n' ';' || true)"
    echo "${rate:-?} req/s ${errors:+($errors)}"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for round in $(seq "$ROUNDS"); do
    for binary in "$@"; do
        for keys in without with; do
            if [ "$keys" = with ] && ! serves_flag "$binary" --api-key; then
                echo "round $round  $binary  keys with: not measured (this build has no --api-key)"
                continue
            fi
            if [ "$keys" = with ]; then
                start_server "$binary" --api-key "$API_KEY" --admin-key "$ADMIN_KEY"
                key="$API_KEY"
            else
                start_server "$binary"
                key=""
            fi
            for streams in $H2LOAD_STREAMS; do
                echo "round $round  $binary  keys $keys  grpc WaitLoraUnpaused -m $streams: $(grpc_rate "$key" "$streams")  [load $(load)]"
            done
            echo "round $round  $binary  keys $keys  http wait_lora_unpaused: $(http_rate "$key")  [load $(load)]"
            if [ "$keys" = without ]; then
                wake="$("$WAKE" --http "$HTTP" --polls "$POLLS" --rounds 3 | tail -n 1)"
                echo "round $round  $binary  wake $POLLS long-polls: $wake  [load $(load)]"
            fi
            stop_server
        done
    done
done
