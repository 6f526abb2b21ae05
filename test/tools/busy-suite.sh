#!/usr/bin/env bash
# Runs the whole suite the hard way: a fresh clone in a private directory, on a busy machine.
#
#   test/tools/busy-suite.sh [REV]        (default HEAD; needs root, like the suite)
#   BUSY_TESTS='build/contract-tests/x.test.js ...' test/tools/busy-suite.sh
#                                         (only those files, after npm ci and the builds)
#
# 1. Clones REV of this repository into a new `mktemp -d` directory (mode 0700, nothing
#    beside the clone): no other user can enter it, and no ../shared or anything else of a
#    developer's checkout is there to lean on.
# 2. Makes the machine busy: one busy-loop process per core (BUSY_LOAD_PROCS, default nproc)
#    and BUSY_CONNECTIONS (default 10000) idle loopback TCP connections, so /proc/net/tcp
#    is long (each of its entries costs every peer-UID lookup time) and the CPU is short.
# 3. Runs `npm ci && npm test` in the clone with AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1 (a
#    test skipped for a missing prerequisite fails, as in CI), and reports pass or fail,
#    the duration, and the failing tests.
#
# Exit code: npm's. The output is kept in the printed directory (the clone too, on failure).
set -euo pipefail

REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
REV=$(git -C "$REPO" rev-parse --verify "${1:-HEAD}^{commit}")
LOAD_PROCS=${BUSY_LOAD_PROCS:-$(nproc)}
CONNECTIONS=${BUSY_CONNECTIONS:-10000}
[ "$(id -u)" = 0 ] || { echo "busy-suite: run it as root (the suite creates users and boots a systemd lab)" >&2; exit 2; }

DIR=$(mktemp -d -t ac-busy-suite.XXXXXX)
chmod 0700 "$DIR"
CLONE=$DIR/agent-connectors
LOG=$DIR/npm-test.log
echo "busy-suite: $REV in $CLONE"
git clone -q --no-checkout "$REPO" "$CLONE"
git -C "$CLONE" checkout -q --detach "$REV"

helpers=()
cleanup() {
  set +e
  local pid
  for pid in "${helpers[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${helpers[@]}"; do wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT

# Two holders, one per end of the connections: one process with both ends would need twice
# the descriptors. Each exits once it has no parent (this script) any more.
ulimit -n "$(ulimit -Hn)"
need=$((CONNECTIONS + 100))
[ "$(ulimit -n)" -ge "$need" ] || { echo "busy-suite: $CONNECTIONS connections need ulimit -n >= $need per process (hard limit $(ulimit -Hn))" >&2; exit 2; }
cat >"$DIR/idle-connections.cjs" <<'EOF'
// node idle-connections.cjs server            → prints the port, then holds what it accepts
// node idle-connections.cjs client PORT N     → opens N connections, prints "ready N", holds them
const net = require('net');
const [role, port, n] = process.argv.slice(2);
const held = [];
const parent = process.ppid;
setInterval(() => { try { process.kill(parent, 0); } catch { process.exit(0); } }, 1000);
if (role === 'server') {
  const srv = net.createServer((s) => { s.on('error', () => {}); held.push(s); });
  srv.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => console.log(srv.address().port));
} else {
  (async () => {
    // In batches: thousands of SYNs at once would overflow the accept queue, and a dropped
    // SYN is retried only after a second.
    for (let i = 0; i < Number(n); i += 500) {
      const batch = [];
      for (let j = i; j < Math.min(Number(n), i + 500); j++) {
        batch.push(new Promise((ok, fail) => {
          const s = net.connect(Number(port), '127.0.0.1', () => ok());
          s.on('error', fail);
          held.push(s);
        }));
      }
      await Promise.all(batch);
    }
    console.log(`ready ${held.length}`);
  })().catch((e) => { console.error(e.message); process.exit(1); });
}
EOF
# First line of a holder's output, once it is there (or the holder has died).
first_line() {
  local out=$1 pid=$2
  for _ in $(seq 1 1200); do
    [ -s "$out" ] && { head -1 "$out"; return; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$out"
}
node "$DIR/idle-connections.cjs" server >"$DIR/server.out" 2>&1 </dev/null &
helpers+=("$!")
port=$(first_line "$DIR/server.out" "$!")
node "$DIR/idle-connections.cjs" client "$port" "$CONNECTIONS" >"$DIR/client.out" 2>&1 </dev/null &
helpers+=("$!")
ready=$(first_line "$DIR/client.out" "$!")
[ "$ready" = "ready $CONNECTIONS" ] || { echo "busy-suite: could not open $CONNECTIONS connections ($ready)" >&2; exit 1; }
echo "busy-suite: $CONNECTIONS idle loopback connections held ($(($(wc -l </proc/net/tcp) - 1)) entries in /proc/net/tcp)"

for _ in $(seq 1 "$LOAD_PROCS"); do
  # Spins until this script is gone, even if it is killed without its cleanup.
  bash -c 'while kill -0 "$PPID" 2>/dev/null; do for _ in {1..200000}; do :; done; done' &
  helpers+=("$!")
done
echo "busy-suite: $LOAD_PROCS busy loops on $(nproc) cores"

start=$(date +%s)
set +e
(
  cd "$CLONE"
  # Nothing of the caller's checkout or test setup may reach the run.
  exec env -u NODE_OPTIONS -u NOTIFY_RECV_PY -u SYSTEMD_LAB_DIR AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1 \
    BUSY_TESTS="${BUSY_TESTS:-}" bash -c 'npm ci --no-audit --no-fund &&
      if [ -n "$BUSY_TESTS" ]; then npm run build && npm run build:test && npx tap $BUSY_TESTS; else npm test; fi'
) >"$LOG" 2>&1 </dev/null
rc=$?
set -e
took=$(($(date +%s) - start))
cleanup
helpers=()

summary=$(grep -E '^# \{ total' "$LOG" | tail -1 || true)
printf 'busy-suite: npm ci && %s %s in %dm%02ds %s\n' "${BUSY_TESTS:-npm test}" "$([ $rc -eq 0 ] && echo PASSED || echo "FAILED (exit $rc)")" $((took / 60)) $((took % 60)) "$summary"
if [ $rc -ne 0 ]; then
  echo "busy-suite: failing tests:"
  grep -E '^ *not ok ' "$LOG" | head -40 || true
  echo "busy-suite: the clone and the whole output are in $DIR"
else
  rm -rf "$CLONE"
  echo "busy-suite: the output is in $LOG"
fi
exit $rc
