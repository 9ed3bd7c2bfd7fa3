#!/usr/bin/env bash
# make demo: the main job on the default testbed (docs/collective.md, "make demo").
#
# Brings up the default testbed (4 hosts, 4 planes, 100 Mbit/s links) with the eBPF dataplane and one
# mrcd per host, under a unique name; runs the 4-rank ring all-reduce of a 64 MiB float32 gradient over
# MRC with 2-bit EDEN (unbiased) and partial-sum-aware aggregation, taking the leaf-spine link p0l0-p0s0
# down in the middle and back up later; then the same run uncompressed; prints both tables and the
# comparison; writes report.json and allreduce.png (per-plane throughput and iteration times over time,
# the failure shaded) into ./demo-results/ (or $MRC_DEMO_RESULTS). Everything it made (namespaces,
# programs, pins, daemons, rank processes) is removed on every exit path, Ctrl-C included, and checked.
#
# Iterations (2 cores, 100 Mbit/s links): an uncompressed 64 MiB iteration takes ~4-5 s here (96 MiB
# sent per rank), a 2-bit one ~1-2 s (codec-bound), so the uncompressed run has fewer iterations.
# Override with DEMO_ITERS_COMPRESSED / DEMO_ITERS_UNCOMPRESSED.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MRCCTL=.venv/bin/mrcctl
PY=.venv/bin/python

if [ "$(id -u)" != 0 ]; then
  echo "make demo: needs root (network namespaces, eBPF programs, one mrcd per host): sudo make demo" >&2
  exit 1
fi

ITERS_C=${DEMO_ITERS_COMPRESSED:-12}
ITERS_U=${DEMO_ITERS_UNCOMPRESSED:-5}
LINK=p0l0:p0s0
results=${MRC_DEMO_RESULTS:-$PWD/demo-results}
name=demo$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
work=$(mktemp -d /tmp/mrc-demo.XXXXXX)
export MRC_RUN_DIR=$work/run
export MRC_BPF_PIN_ROOT=/sys/fs/bpf/mrc-demo-$name
mkdir -p "$MRC_RUN_DIR"
t_start=$(date +%s)
progs_before=$(bpftool prog show 2>/dev/null | grep -c '^[0-9]' || true)

step() { printf '\n== %s\n' "$*"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  step "Tearing down testbed $name"
  $MRCCTL testbed down --name "$name" >/dev/null 2>&1 || $MRCCTL testbed down --name "$name"
  rmdir "$MRC_BPF_PIN_ROOT" 2>/dev/null
  local left=0
  if ip netns list | grep -q "^$name-"; then echo "left behind: namespaces $(ip netns list | grep -c "^$name-")"; left=1; fi
  if [ -e "$MRC_BPF_PIN_ROOT" ]; then echo "left behind: pins under $MRC_BPF_PIN_ROOT"; left=1; fi
  if pgrep -f -- "--testbed $name " >/dev/null || pgrep -f -- "--ns $name-" >/dev/null; then
    echo "left behind: processes $(pgrep -f -- "$name" | tr '\n' ' ')"; left=1
  fi
  local progs_after
  progs_after=$(bpftool prog show 2>/dev/null | grep -c '^[0-9]' || true)
  rm -rf "$work"
  if [ "$left" = 0 ]; then
    echo "nothing left behind: no $name-* namespace (ip netns list), no pin under $MRC_BPF_PIN_ROOT," \
         "no mrcd or rank process; BPF programs loaded: $progs_before before, $progs_after after" \
         "(bpftool prog show; other users' programs included)"
  fi
  echo "demo took $(( $(date +%s) - t_start )) s"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "Bringing up the default testbed '$name' with the dataplane and one mrcd per host"
$MRCCTL testbed up deploy/topologies/default.toml --name "$name" --with-daemons \
  --metrics-base $((20000 + RANDOM % 30000))

run() {  # run OUT.json ARGS...: one all-reduce run over MRC: progress, then its table; the JSON to OUT
  local out=$1; shift
  $MRCCTL allreduce --transport mrc -n "$name" --ranks 4 --size 64M --sample-ms 250 --report "$out" "$@"
}

step "4 ranks over MRC, 64 MiB float32, 2-bit EDEN unbiased, partial-sum aware, $ITERS_C iterations;" \
     "link ${LINK/:/-} down 10 s in, up 12 s later"
run "$work/compressed.json" --scheme eden-unbiased --bits 2 --partial-sums aware --iters "$ITERS_C" \
  --fail-link "$LINK@10" --heal-after 12

step "The same run uncompressed (float32 chunks), $ITERS_U iterations; link down 7 s in, up 10 s later"
run "$work/uncompressed.json" --scheme none --iters "$ITERS_U" --fail-link "$LINK@7" --heal-after 10

step "Results"
mkdir -p "$results"
status=0
$PY deploy/demo_report.py "$work/compressed.json" "$work/uncompressed.json" "$results" || status=$?
cp "$work/compressed.json" "$work/uncompressed.json" "$results/"
echo
echo "results in $results: report.json, allreduce.png, compressed.json, uncompressed.json"
exit "$status"
