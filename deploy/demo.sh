#!/usr/bin/env bash
# make demo: the main job on the default testbed. The testbed, dataplane and all-reduce are still being
# built (see the issue tracker), so today the demo tours what works end to end: the MRC wire format as
# Wireshark and our own tools see it, and the gradient compressors side by side.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MRCCTL=.venv/bin/mrcctl
work=$(mktemp -d /tmp/mrc-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "MRC wire format (mrcctl wire show)"
$MRCCTL wire show

step "Representative packets of every type, as on the fabric (mrcctl wire sample)"
$MRCCTL wire sample --out "$work/mrc.pcap" --count 1

if command -v tshark >/dev/null; then
  step "What Wireshark sees: InfiniBand BTH/RETH plus our MXH/control dissector (deploy/wireshark/mrc.lua)"
  tshark -X lua_script:deploy/wireshark/mrc.lua -r "$work/mrc.pcap" 2>/dev/null
fi

step "Our decoder, with ICRC checks and rejections by reason (mrcctl wire decode)"
$MRCCTL wire decode "$work/mrc.pcap"

if $MRCCTL quant --help >/dev/null 2>&1; then
  step "Gradient compression: vNMSE and speed per scheme and bit budget (mrcctl quant bench)"
  $MRCCTL quant bench --dim 65536 --trials 8 --bits 1,2,3,4
fi
