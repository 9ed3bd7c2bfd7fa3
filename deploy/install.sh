#!/usr/bin/env bash
# Install mrcd on a real host (run as root): the systemd unit, the host configuration, the Prometheus
# target and rule files and the Grafana provisioning (docs/deploy.md, "systemd").
#
#   deploy/install.sh [--root DIR] [--prefix DIR] [--dry-run] [--uninstall [--purge]]
#                     [--no-prometheus] [--no-grafana] [--prometheus-url URL]
#
#   /etc/systemd/system/mrcd.service   deploy/systemd/mrcd.service, ExecStart= and ExecStopPost= pointed
#                                      at this host's mrcd and mrcctl
#   /etc/mrc/mrcd.toml                 deploy/mrcd.example.toml, only when there is none (edit it, then
#                                      `mrcd --check-config /etc/mrc/mrcd.toml`)
#   /etc/prometheus/mrc/mrcd-targets.yml   a file_sd target: this host's mrcd ([metrics] address)
#   /etc/prometheus/mrc/mrc.rules.yml      the alert rules (deploy/prometheus/mrc.rules.yml)
#   Grafana provisioning               deploy/grafana/install.sh (data source, provider, dashboard)
#   /usr/share/doc/mrc/                docs/deploy.md, daemon.md (the unit's Documentation=)
#
# mrcd is $MRCD, else PREFIX/bin/mrcd with --prefix (a virtualenv), else `command -v mrcd`; mrcctl is
# $MRCCTL, else mrcd's sibling, else `command -v mrcctl`. --root DIR writes every file under DIR (a DESTDIR;
# the paths inside the files stay those of the host) and never calls systemctl. `systemctl daemon-reload`
# runs only when PID 1 is systemd and --root is not given. --dry-run prints each step, changing nothing.
# --uninstall removes what this script installs except /etc/mrc/mrcd.toml (--purge removes it too).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UNIT_SRC=$here/systemd/mrcd.service
CONFIG_SRC=$here/mrcd.example.toml
RULES_SRC=$here/prometheus/mrc.rules.yml
GRAFANA_INSTALL=$here/grafana/install.sh
DOCS_SRC=$(dirname "$here")/docs

UNIT=/etc/systemd/system/mrcd.service
CONFIG=/etc/mrc/mrcd.toml
PROM_DIR=/etc/prometheus/mrc
DOC_DIR=/usr/share/doc/mrc
# the paths the shipped unit names; replaced by the ones found here
UNIT_MRCD=/usr/local/bin/mrcd
UNIT_MRCCTL=/usr/local/bin/mrcctl

say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '5,6p' "$0" | sed 's/^# *//' >&2; exit 2; }

root=
prefix=
dry=0
uninstall=0
purge=0
with_prom=1
with_grafana=1
prom_url=http://127.0.0.1:9090
while [ $# -gt 0 ]; do
  case "$1" in
    --root) [ $# -ge 2 ] || usage; root=${2%/}; shift 2 ;;
    --prefix) [ $# -ge 2 ] || usage; prefix=${2%/}; shift 2 ;;
    --dry-run|-n) dry=1; shift ;;
    --uninstall) uninstall=1; shift ;;
    --purge) purge=1; shift ;;
    --no-prometheus) with_prom=0; shift ;;
    --no-grafana) with_grafana=0; shift ;;
    --prometheus-url) [ $# -ge 2 ] || usage; prom_url=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) printf 'install: error: unknown argument: %s\n' "$1" >&2; usage ;;
  esac
done
case "$root" in ''|/*) ;; *) die "--root must be an absolute path, got '$root'" ;; esac
[ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge goes with --uninstall"
if [ -z "$root" ] && [ "$dry" = 0 ] && [ "$(id -u)" != 0 ]; then
  die "writes /etc: run as root (or --dry-run to see what it would do, --root DIR to stage into DIR)"
fi

# PID 1 is systemd exactly when /run/systemd/system exists (sd_booted(3))
systemd_pid1() { [ -z "$root" ] && [ -d /run/systemd/system ]; }

# run CMD...: do it, or only say it with --dry-run
run() {
  if [ "$dry" = 1 ]; then
    printf 'would run: %s\n' "$*"
  else
    "$@"
  fi
}

# put MODE DEST: write stdin, byte for byte, to $root$DEST (parent folders 0755) through a temporary file
# next to it, or only say so with --dry-run
put() {
  local mode=$1 dest=$root$2
  if [ "$dry" = 1 ]; then
    printf 'would write: %s (mode %s, %s lines)\n' "$dest" "$mode" "$(wc -l | tr -d ' ')"
    return
  fi
  install -d -m 0755 "$(dirname "$dest")"
  cat > "$dest.tmp"
  chmod "$mode" "$dest.tmp"
  mv -f "$dest.tmp" "$dest"
  say "wrote $dest"
}

# remove DEST...: remove $root$DEST, or say so with --dry-run
remove() {
  local f
  for f in "$@"; do
    if [ -e "$root$f" ]; then
      if [ "$dry" = 1 ]; then printf 'would remove: %s\n' "$root$f"; else rm -f "$root$f"; say "removed $root$f"; fi
    fi
  done
}

# A path systemd can run as it is: absolute; no quotes, backslashes, '$' or '%' (systemd expands them),
# '|' or '&' (the sed below), backquotes, and no whitespace but blanks. A path with blanks is written
# double-quoted (unit_word): systemd takes a quoted word of a command line as one argument, and the
# quotes inside ExecStopPost's sh -c script quote it for sh.
check_unit_path() {
  case "$2" in
    /*) ;;
    *) die "$1 '$2' is not an absolute path" ;;
  esac
  case "$2" in
    *[$'\t\n\r\v\f']*|*[\'\"\\\$%\|\&\`]*)
      die "$1 '$2' has a quote, backslash, tab or newline, or one of \$ % | & \`: systemd (or this script) cannot use it as written; install mrc under a plainer path" ;;
  esac
}

# unit_word PATH: PATH as one word of the unit's command lines (double-quoted when it has a blank)
unit_word() {
  case "$1" in
    *" "*) printf '"%s"' "$1" ;;
    *) printf '%s' "$1" ;;
  esac
}

grafana_args() {
  local a=(--prometheus "$prom_url")
  [ -z "$root" ] || a+=(--root "$root")
  printf '%s\n' "${a[@]}"
}

# -------------------------------------------------------------------------------------------- uninstall
if [ "$uninstall" = 1 ]; then
  if systemd_pid1 && systemctl cat mrcd.service >/dev/null 2>&1; then
    run systemctl disable --now mrcd.service
  fi
  remove "$UNIT" "$DOC_DIR/deploy.md" "$DOC_DIR/daemon.md"
  [ ! -d "$root$DOC_DIR" ] || run rmdir --ignore-fail-on-non-empty "$root$DOC_DIR"
  if [ "$with_prom" = 1 ]; then
    remove "$PROM_DIR/mrcd-targets.yml" "$PROM_DIR/mrc.rules.yml"
    [ ! -d "$root$PROM_DIR" ] || run rmdir --ignore-fail-on-non-empty "$root$PROM_DIR"
  fi
  if [ "$with_grafana" = 1 ]; then
    mapfile -t ga < <(grafana_args)
    run sh "$GRAFANA_INSTALL" "${ga[@]}" --uninstall
  fi
  if [ "$purge" = 1 ]; then
    remove "$CONFIG"
    [ ! -d "$root/etc/mrc" ] || run rmdir --ignore-fail-on-non-empty "$root/etc/mrc"
  elif [ -e "$root$CONFIG" ]; then
    say "kept $root$CONFIG (--purge removes it)"
  fi
  if systemd_pid1; then run systemctl daemon-reload; fi
  say "uninstalled${root:+ from $root}"
  exit 0
fi

# ---------------------------------------------------------------------------------------------- install
for f in "$UNIT_SRC" "$CONFIG_SRC" "$RULES_SRC" "$GRAFANA_INSTALL"; do
  [ -f "$f" ] || die "$f is missing: run this script from an mrc source tree"
done

if [ -n "${MRCD:-}" ]; then
  mrcd=$MRCD
elif [ -n "$prefix" ]; then
  mrcd=$prefix/bin/mrcd
else
  mrcd=$(command -v mrcd || true)
  [ -n "$mrcd" ] || die "mrcd not found on PATH: pip install mrc (or give --prefix VENV or MRCD=/path/to/mrcd)"
fi
check_unit_path mrcd "$mrcd"
# with --root the binary may be staged under DIR rather than installed on this machine
[ -x "$mrcd" ] || [ -x "$root$mrcd" ] || die "mrcd '$mrcd' is not an executable file"
if [ -n "${MRCCTL:-}" ]; then
  mrcctl=$MRCCTL
elif [ -x "$(dirname "$mrcd")/mrcctl" ] || [ -x "$root$(dirname "$mrcd")/mrcctl" ]; then
  mrcctl=$(dirname "$mrcd")/mrcctl
else
  mrcctl=$(command -v mrcctl || true)
  [ -n "$mrcctl" ] || die "mrcctl not found next to $mrcd nor on PATH (give MRCCTL=/path/to/mrcctl)"
fi
check_unit_path mrcctl "$mrcctl"
say "mrcd: $mrcd, mrcctl: $mrcctl"

# The interpreter of mrcd's script (a virtualenv's python) and where the mrc package lives: under a home
# folder (/home, /root), ProtectHome=yes would hide them from the service; read-only lets it run.
mrcd_real=$mrcd
[ -x "$mrcd_real" ] || mrcd_real=$root$mrcd
py=$(head -n 1 "$mrcd_real" | sed -n 's/^#![[:space:]]*//p' | cut -d ' ' -f 1)
if [ "$py" = /bin/sh ]; then
  # pip's launcher for an interpreter whose path has a blank: "#!/bin/sh", then '''exec' "PYTHON" "$0" "$@"
  py=$(sed -n "2s/^'''exec' \"\([^\"]*\)\".*/\1/p" "$mrcd_real")
fi
if [ -z "$py" ] || [ ! -x "$py" ] || ! "$py" -c 'import sys' 2>/dev/null; then py=$(command -v python3 || true); fi
pkg=
if [ -n "$py" ]; then
  pkg=$("$py" -c 'import os, mrc; print(os.path.dirname(os.path.realpath(mrc.__file__)))' 2>/dev/null || true)
fi
protect_home=yes
for p in "$mrcd" "$(readlink -f "$mrcd_real")" "$py" "$pkg"; do
  case "$p" in
    /home/*|/root/*|/run/user/*) protect_home=read-only ;;
  esac
done
[ "$protect_home" = yes ] || say "mrc lives under a home folder: the unit gets ProtectHome=read-only"

grep -q "^ExecStart=$UNIT_MRCD " "$UNIT_SRC" || die "$UNIT_SRC: no 'ExecStart=$UNIT_MRCD ...' line to rewrite"
sed -e "s|^ExecStart=$UNIT_MRCD |ExecStart=$(unit_word "$mrcd") |" \
    -e "s|$UNIT_MRCCTL |$(unit_word "$mrcctl") |" \
    -e "s|^ProtectHome=yes\$|ProtectHome=$protect_home|" \
    "$UNIT_SRC" | put 0644 "$UNIT"

if [ -e "$root$CONFIG" ]; then
  say "kept $root$CONFIG (it exists)"
else
  put 0644 "$CONFIG" < "$CONFIG_SRC"
  say "edit $root$CONFIG for this host, then: mrcd --check-config $CONFIG"
fi

# the documents the unit's Documentation= names (systemctl help mrcd)
for d in deploy.md daemon.md; do
  if [ -f "$DOCS_SRC/$d" ]; then put 0644 "$DOC_DIR/$d" < "$DOCS_SRC/$d"; fi
done

if [ "$with_prom" = 1 ]; then
  # the [metrics] address of the configuration in place (the example when there was none)
  cfg=$root$CONFIG
  [ -e "$cfg" ] || cfg=$CONFIG_SRC
  metrics=
  if [ -n "$py" ]; then
    metrics=$("$py" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    m = tomllib.load(f).get("metrics") or {}
print(m.get("address", ""))' "$cfg" 2>/dev/null) \
      || die "$cfg: not valid TOML (mrcd --check-config $cfg says where)"
  fi
  if [ -n "$metrics" ]; then
    printf '%s\n' "# Written by deploy/install.sh from $CONFIG ([metrics] address): this host's mrcd." \
      "# Prometheus reads it through file_sd_configs (see the scrape job below)." \
      "- targets: [\"$metrics\"]" | put 0644 "$PROM_DIR/mrcd-targets.yml"
  else
    say "no [metrics] address in $cfg: no Prometheus target written"
  fi
  put 0644 "$PROM_DIR/mrc.rules.yml" < "$RULES_SRC"
  say "Prometheus: add to /etc/prometheus/prometheus.yml (then reload it):"
  say "  rule_files: [\"$PROM_DIR/mrc.rules.yml\"]"
  say "  scrape_configs: [{job_name: mrcd, file_sd_configs: [{files: [\"$PROM_DIR/mrcd-targets.yml\"]}]}]"
fi

if [ "$with_grafana" = 1 ]; then
  mapfile -t ga < <(grafana_args)
  run sh "$GRAFANA_INSTALL" "${ga[@]}"
fi

if systemd_pid1; then
  run systemctl daemon-reload
  say "next: systemctl enable --now mrcd   (journalctl -u mrcd follows it)"
elif [ -z "$root" ]; then
  say "PID 1 is not systemd: no daemon-reload (start mrcd with: $mrcd --config $CONFIG)"
fi
say "done${root:+ (staged under $root)}"
