#!/usr/bin/env bash
# mrc setup: Debian packages, kernel headers for BCC, and the project virtualenv.
#
# Idempotent: every step checks before it acts, so re-running is cheap and safe.
# Usage: deploy/setup.sh [--no-apt]    (run as root for the apt and headers steps)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
VENV=${VENV:-.venv}
SYSPY=/usr/bin/python3

# Debian packages the project needs, and why:
#   python3-bpfcc        BCC (compiles and loads the eBPF dataplane; not on PyPI)
#   linux-headers-amd64  kernel headers BCC compiles against
#   bpftool              inspect/detach programs ("mrcctl prog" and the operator)
#   iproute2 ethtool     links, routes, qdiscs, driver counters
#   tcpdump tshark       captures and the BTH/RETH/MXH decode tests
#   iperf3               kernel TCP baseline in benchmarks
#   prometheus           metrics scrape and rule checks (promtool)
#   python3-venv         the virtualenv module for the system Python
#   gcc python3-dev      build the engine's fast path and the simulator's event loop in C
#                        (mrc/transport/_fastc.c, mrc/sim/_simc.c; without them the same code runs in
#                        Python, slower)
#   systemd              systemd-analyze: the unit's verify and security tests (absent from minimal images
#                        and containers; installing it starts nothing there)
APT_PKGS=(python3-bpfcc python3-venv gcc python3-dev linux-headers-amd64 bpftool iproute2 ethtool tcpdump tshark iperf3 prometheus
          systemd)

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

no_apt=0
[ "${1:-}" = "--no-apt" ] && no_apt=1

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ $no_apt = 1 ]; then
    say "skipping apt (--no-apt); missing: ${missing[*]}"
  elif [ "$(id -u)" != 0 ]; then
    die "missing Debian packages: ${missing[*]}; run 'sudo make setup' or: apt-get install ${missing[*]}"
  else
    say "installing Debian packages: ${missing[*]}"
    # tshark asks whether non-root users may capture; answer it so the install never blocks.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed"
  fi
else
  say "Debian packages present"
fi

# BCC compiles against /lib/modules/$(uname -r)/build. Containers and custom kernels often lack it:
# link the nearest Debian headers tree there. Networking programs only use the stable UAPI.
kver=$(uname -r)
kdir=/lib/modules/$kver
if [ ! -e "$kdir/build" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$hdr" ]; then
    say "warning: no kernel headers in /usr/src; BCC programs will not compile (apt-get install linux-headers-amd64)"
  elif [ "$(id -u)" != 0 ]; then
    say "warning: $kdir/build is missing; as root, setup links $hdr there"
  else
    mkdir -p "$kdir"
    ln -sfn "$hdr" "$kdir/build"
    # Debian splits the tree: <ver>-amd64 (config, generated) and <ver>-common (include/linux/kconfig.h
    # and the rest), which BCC finds through `source`
    common="${hdr%-amd64}-common"
    [ -d "$common" ] || common="$hdr"
    ln -sfn "$common" "$kdir/source"
    say "linked kernel headers $hdr -> $kdir/build (and source): the running kernel $kver has no headers package"
  fi
fi
# A `source` link to the -amd64 half of Debian's headers lacks include/linux/kconfig.h: BCC then fails
# with "'./include/linux/kconfig.h' file not found". Point it at the -common half.
if [ "$(id -u)" = 0 ] && [ -e "$kdir/build" ] && [ ! -e "$kdir/source/include/linux/kconfig.h" ]; then
  real=$(readlink -f "$kdir/build")
  if [ -e "${real%-amd64}-common/include/linux/kconfig.h" ]; then
    ln -sfn "${real%-amd64}-common" "$kdir/source"
    say "linked $kdir/source -> ${real%-amd64}-common (BCC needs include/linux/kconfig.h)"
  fi
fi

# The virtualenv sees the system site-packages, which is where Debian's BCC lives.
[ -x "$SYSPY" ] || die "$SYSPY not found: install python3 (Debian 12: apt-get install python3 python3-venv)"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV from $SYSPY (--system-site-packages, for BCC)"
  "$SYSPY" -m venv --system-site-packages "$VENV" || die "venv creation failed: apt-get install python3-venv"
fi
stamp="$VENV/.mrc-installed"
fastc=mrc/transport/_fastc.c
simc=mrc/sim/_simc.c
# any C source or header of the extensions newer than the install (not only the two main files: _roce.c
# and _roce.h too)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
   || [ -n "$(find mrc -name '*.[ch]' -newer "$stamp" -print -quit)" ] \
   || ! compgen -G "mrc/transport/_fastc*.so" >/dev/null \
   || ! compgen -G "mrc/sim/_simc*.so" >/dev/null; then
  say "installing mrc (editable, [dev]) into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[dev]' || die "pip install -e .[dev] failed"
  touch "$stamp"
else
  say "$VENV up to date"
fi
"$VENV/bin/python" -c 'import mrc.transport._fastc' 2>/dev/null && say "engine fast path: C ($fastc)" \
  || say "warning: $fastc did not build (apt-get install gcc python3-dev); the fast path runs in Python"
"$VENV/bin/python" -c 'import mrc.sim._simc' 2>/dev/null && say "simulator event loop: C ($simc)" \
  || say "warning: $simc did not build (apt-get install gcc python3-dev); the simulator's loop runs in Python"
# torch (CPU) for the DDP communication hook and its test (mrc.collective.ddp; mrc itself never needs it):
# pinned, because an unpinned `torch` resolves to a multi-GB CUDA build; pip takes the machine's local
# wheel (find-links) when there is one. Only installed when the venv cannot import it already.
TORCH_PIN=torch==2.13.0
if "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  say "torch importable from $VENV"
else
  say "installing $TORCH_PIN into $VENV (for the DDP hook test)"
  "$VENV/bin/python" -m pip install -q "$TORCH_PIN" \
    || say "warning: pip install $TORCH_PIN failed; the DDP hook test will be skipped"
fi
"$VENV/bin/python" -c 'import bcc' 2>/dev/null && say "bcc importable from $VENV" \
  || say "warning: 'import bcc' fails in $VENV (apt-get install python3-bpfcc)"
# the codec's numba kernels are compiled on first use and cached next to their source: compile them now,
# once (a few seconds), rather than in every rank of the first all-reduce at once (docs/quant.md §8)
"$VENV/bin/python" -c 'from mrc.quant.accel import prime; print("setup: codec kernels:", prime())' \
  || say "warning: the codec's numba kernels did not compile (MRC_QUANT_KERNELS=numpy selects the numpy path)"
say "done"
