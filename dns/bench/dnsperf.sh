#!/usr/bin/env bash
# dnsperf against `xcc dns` and Knot DNS serving the same names, side by side.
#
# Generates N names (default 10000) under zone xcc.test, writes them as a static records file
# for `xcc dns` (JSON, which it reads without the YAML parser's buffering) and as a zone file
# for knotd, starts both on 127.0.0.1 high ports with their
# default worker counts, runs dnsperf for DURATION seconds against each (same query file, same
# client settings) in alternating rounds, and prints each run and the medians. Nothing here is
# needed by CI.
#
# Needs: dnsperf, knotd and kdig (Debian: apt-get install dnsperf knot knot-dnsutils) and a
# release build of xcc (cargo build --release --bin xcc).
#
# Usage: dns/bench/dnsperf.sh [-n NAMES] [-l SECONDS] [-c CLIENTS] [-q OUTSTANDING]
#                                [-m MIX] [-r ROUNDS] [-t udp|tcp] [-Q QPS] [-x XCC_BINARY]
#   MIX: "hit" (default: A queries for existing names, in random order) or
#        "mixed" (80% A hits, 10% AAAA NODATA, 10% NXDOMAIN).
#   -t: transport dnsperf uses (default udp). -Q: a fixed query rate; the rows then also carry
#   the p50 and p99 latency, from dnsperf's per-query report (-v).
# Each server's resident memory (VmRSS, split into anonymous and file-backed pages) is printed
# once its zone is loaded and after the runs. The file-backed part depends on how the
# executables' pages came into the page cache (a binary the linker just wrote sits there in
# large folios, mapped whole; one read back through a fault is read ahead by the disk's
# read_ahead_kb), so both servers' executables and libraries are dropped from the page cache
# first, as on a node that has just pulled the image, and read_ahead_kb is printed.
set -euo pipefail

NAMES=10000
SECONDS_PER_RUN=10
CLIENTS=4
OUTSTANDING=100
MIX=hit
ROUNDS=3
TRANSPORT=udp
RATE=
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
XCC="${CARGO_TARGET_DIR:-$ROOT/target}/release/xcc"
while getopts "n:l:c:q:m:r:t:Q:x:" opt; do
  case "$opt" in
    n) NAMES=$OPTARG ;;
    l) SECONDS_PER_RUN=$OPTARG ;;
    c) CLIENTS=$OPTARG ;;
    q) OUTSTANDING=$OPTARG ;;
    m) MIX=$OPTARG ;;
    r) ROUNDS=$OPTARG ;;
    t) TRANSPORT=$OPTARG ;;
    Q) RATE=$OPTARG ;;
    x) XCC=$OPTARG ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
  esac
done
for tool in dnsperf knotd kdig; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install dnsperf knot knot-dnsutils)" >&2; exit 1; }
done
[ -x "$XCC" ] || { echo "missing $XCC (cargo build --release --bin xcc)" >&2; exit 1; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] && echo "kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT
# Also clean up when interrupted or when the reader of our output goes away.
trap 'exit 1' INT TERM HUP PIPE

# A free port on 127.0.0.1 (UDP and TCP are both bound by the servers).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- data -------------------------------------------------------------------------------------
ZONE=xcc.test
python3 - "$NAMES" "$ZONE" "$WORK" "$MIX" <<'PY'
import json, random, sys
n, zone, work, mix = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
names = [f"svc-{i}.bench.{zone}" for i in range(n)]
addr = lambda i: f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
with open(f"{work}/records.json", "w") as f:
    json.dump([{"fqdn": name, "addresses": [addr(i)]} for i, name in enumerate(names)], f)
with open(f"{work}/{zone}.zone", "w") as f:
    f.write(f"$ORIGIN {zone}.\n$TTL 5\n")
    f.write(f"@ SOA ns.dns.{zone}. hostmaster.{zone}. 1 7200 1800 86400 5\n@ NS ns.dns.{zone}.\nns.dns A 127.0.0.1\n")
    for i, name in enumerate(names):
        f.write(f"{name}. A {addr(i)}\n")
rng = random.Random(42)
with open(f"{work}/queries.txt", "w") as f:
    for _ in range(4):  # four shuffled passes; dnsperf loops over the file anyway
        order = list(range(n))
        rng.shuffle(order)
        for i in order:
            r = rng.random() if mix == "mixed" else 0.0
            if r < 0.8:
                f.write(f"{names[i]} A\n")
            elif r < 0.9:
                f.write(f"{names[i]} AAAA\n")
            else:
                f.write(f"missing-{i}.bench.{zone} A\n")
PY

# --- servers ----------------------------------------------------------------------------------
KNOT_PORT=$(free_port)
XCC_PORT=$(free_port)
mkdir -p "$WORK/knot"
cat > "$WORK/knot.conf" <<EOF
server:
    rundir: "$WORK/knot"
    listen: 127.0.0.1@$KNOT_PORT
log:
  - target: stderr
    any: warning
database:
    storage: "$WORK/knot"
template:
  - id: default
    storage: "$WORK"
    semantic-checks: off
zone:
  - domain: $ZONE
    file: "$WORK/$ZONE.zone"
EOF
# Start both from the disk, not from whatever the page cache holds of them (see the top).
evict() { python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
KNOTD="$(command -v knotd)"
evict "$XCC" "$KNOTD" $(ldd "$KNOTD" "$XCC" | awk '$3 ~ /^\// { print $3 }' | sort -u) || true
DISK=$(df --output=source "$XCC" | tail -1 | sed 's|/dev/||; s|[0-9]*$||')
echo "read_ahead_kb of $DISK: $(cat "/sys/block/$DISK/queue/read_ahead_kb" 2>/dev/null || echo unknown)"
knotd -c "$WORK/knot.conf" 2>"$WORK/knot.log" &
KNOT_PID=$!
PIDS+=($KNOT_PID)
XCC_LOG=warn "$XCC" dns --listen "127.0.0.1:$XCC_PORT" --zone "$ZONE" --feed static \
  --static-records "$WORK/records.json" --metrics-listen "" 2>"$WORK/xcc.log" &
XCC_PID=$!
PIDS+=($XCC_PID)

# Wait until each answers the last generated name (both load the whole zone before answering).
ready() {
  for _ in $(seq 1 200); do
    local out
    out=$(kdig +short +time=1 +retry=0 @127.0.0.1 -p "$1" "svc-$((NAMES - 1)).bench.$ZONE" A 2>/dev/null || true)
    [[ $out == 10.* ]] && return 0
    sleep 0.1
  done
  echo "server on port $1 did not come up" >&2
  cat "$WORK/knot.log" "$WORK/xcc.log" >&2 || true
  exit 1
}
ready "$KNOT_PORT"
ready "$XCC_PORT"
rss() {
  awk '/^VmRSS:/ { t = $2 } /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 }
    END { printf "%.1f MB (anon %.1f + file %.1f)", t / 1024, a / 1024, f / 1024 }' "/proc/$1/status"
}
echo "resident after loading $NAMES names: knotd $(rss "$KNOT_PID"), xcc dns $(rss "$XCC_PID")"

# --- runs -------------------------------------------------------------------------------------
# Rounds alternate knot and xcc dns so both see the same background load; the summary takes the
# median of each column. Server CPU is read from /proc (user + system ticks of the server
# process during the run), a measure that background load disturbs less than queries/s.
TICK_US=$((1000000 / $(getconf CLK_TCK)))
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # name port pid
  local out="$WORK/$1.out" c0 c1
  c0=$(cpu_ticks "$3")
  local extra=()
  [ -n "$RATE" ] && extra=(-Q "$RATE" -v)
  dnsperf -s 127.0.0.1 -p "$2" -m "$TRANSPORT" -d "$WORK/queries.txt" -l "$SECONDS_PER_RUN" \
    -c "$CLIENTS" -q "$OUTSTANDING" "${extra[@]}" >"$out" 2>&1
  c1=$(cpu_ticks "$3")
  # Per-query lines of -v end with the latency in seconds; p50 and p99 in ms (0 without -Q).
  local pct
  pct=$(awk '/^> / { print $NF * 1000 }' "$out" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR) printf "%.3f %.3f", v[int(NR * 0.5) + 1], v[int(NR * 0.99) + 1]; else print "0 0" }')
  awk -v name="$1" -v ticks=$((c1 - c0)) -v tick_us="$TICK_US" -v load="$(cut -d' ' -f1 /proc/loadavg)" -v pct="$pct" '
    /Queries completed:/ { done = $3 }
    /Queries lost:/ { lost = $3 }
    /Queries per second:/ { qps = $4 }
    /Average Latency/ { gsub(/[(),]/, ""); avg = $4 * 1000; min = $6 * 1000; max = $8 * 1000 }
    /Latency StdDev/ { sd = $4 * 1000 }
    END {
      printf "%-8s %11.0f %9.3f %9.3f %9.3f %9.3f %7d %12.2f %6s %s\n", name, qps, avg, min, max, sd, lost,
        ticks * tick_us / done, load, pct
    }' "$out" | tee -a "$WORK/rows"
}
median() { # name column
  awk -v n="$1" -v c="$2" '$1 == n { print $c }' "$WORK/rows" | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo "names=$NAMES mix=$MIX transport=$TRANSPORT rate=${RATE:-unlimited} rounds=$ROUNDS duration=${SECONDS_PER_RUN}s clients=$CLIENTS outstanding=$OUTSTANDING cpus=$(nproc)"
echo "knotd: $(knotd --version | head -1 | tr -d '\n'); dnsperf: $(dnsperf -h 2>&1 | grep -m1 Version | tr -d '\n')"
HEADER=$(printf "%-8s %11s %9s %9s %9s %9s %7s %12s %6s %s" server "queries/s" "avg ms" "min ms" "max ms" "sd ms" lost "cpu us/query" load "p50 p99 ms")
echo "$HEADER"
for _ in $(seq 1 "$ROUNDS"); do
  run knot "$KNOT_PORT" "$KNOT_PID"
  run xcc-dns "$XCC_PORT" "$XCC_PID"
done
echo
echo "median of $ROUNDS rounds:"
echo "$HEADER" | cut -c1-62
for name in knot xcc-dns; do
  printf "%-8s %11.0f %9.3f %9.3f %9.3f %9.3f  p99 %s ms\n" "$name" "$(median $name 2)" "$(median $name 3)" \
    "$(median $name 4)" "$(median $name 5)" "$(median $name 6)" "$(median $name 11)"
done
echo "resident after the runs: knotd $(rss "$KNOT_PID"), xcc dns $(rss "$XCC_PID")"
awk -v x="$(median xcc-dns 2)" -v k="$(median knot 2)" -v xc="$(median xcc-dns 8)" -v kc="$(median knot 8)" \
  'BEGIN { printf "xcc dns / knot: throughput %.0f%%, server CPU per query %.2f us vs %.2f us\n", 100 * x / k, xc, kc }'
