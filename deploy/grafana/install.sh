#!/bin/sh
# Install mrc's Grafana provisioning: the Prometheus data source, the dashboard provider and the MRC
# overview dashboard (docs/daemon.md, "Metrics"). Grafana reads provisioning at start: restart it after.
#
#   deploy/grafana/install.sh [--provisioning DIR] [--dashboards DIR] [--prometheus URL] [--root DIR] [--uninstall]
#
# Defaults: Debian/RPM Grafana's /etc/grafana/provisioning, dashboards in /var/lib/grafana/dashboards/mrc,
# Prometheus at http://127.0.0.1:9090. The provider's path is rewritten to the dashboards folder and the
# data source's url to the Prometheus URL. Files are written with mode 0644; nothing else is touched.
# --root DIR writes every file under DIR (a DESTDIR: the paths inside the files stay as given);
# --uninstall removes the three files (and the dashboards folder when it is left empty).
set -eu

here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
prov=/etc/grafana/provisioning
dash=/var/lib/grafana/dashboards/mrc
prom=http://127.0.0.1:9090
root=
uninstall=0

usage() { sed -n '5p' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --provisioning) [ $# -ge 2 ] || usage; prov=$2; shift 2 ;;
    --dashboards) [ $# -ge 2 ] || usage; dash=$2; shift 2 ;;
    --prometheus) [ $# -ge 2 ] || usage; prom=$2; shift 2 ;;
    --root) [ $# -ge 2 ] || usage; root=${2%/}; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage ;;
  esac
done
case "$dash" in /*) ;; *) echo "install.sh: --dashboards must be an absolute path (Grafana reads it)" >&2; exit 2 ;; esac
case "$prom" in *'|'*) echo "install.sh: --prometheus must not contain '|'" >&2; exit 2 ;; esac
case "$dash" in *'|'*) echo "install.sh: --dashboards must not contain '|'" >&2; exit 2 ;; esac

case "$root" in ''|/*) ;; *) echo "install.sh: --root must be an absolute path" >&2; exit 2 ;; esac
P=$root$prov  # where the files go; $dash (unprefixed) is what the provider file names
D=$root$dash

if [ "$uninstall" = 1 ]; then
  rm -f "$P/datasources/mrc.yaml" "$P/dashboards/mrc.yaml" "$D/mrc-overview.json"
  rmdir "$D" 2>/dev/null || true
  echo "removed: $P/datasources/mrc.yaml, $P/dashboards/mrc.yaml, $D/mrc-overview.json"
  exit 0
fi

install -d -m 0755 "$P/datasources" "$P/dashboards" "$D"
sed "s|^\( *url:\).*|\1 $prom|" "$here/provisioning/datasources/mrc.yaml" > "$P/datasources/mrc.yaml.tmp"
sed "s|^\( *path:\).*|\1 $dash|" "$here/provisioning/dashboards/mrc.yaml" > "$P/dashboards/mrc.yaml.tmp"
chmod 0644 "$P/datasources/mrc.yaml.tmp" "$P/dashboards/mrc.yaml.tmp"
mv "$P/datasources/mrc.yaml.tmp" "$P/datasources/mrc.yaml"
mv "$P/dashboards/mrc.yaml.tmp" "$P/dashboards/mrc.yaml"
install -m 0644 "$here/dashboards/mrc-overview.json" "$D/mrc-overview.json"
echo "installed: $P/datasources/mrc.yaml (Prometheus $prom), $P/dashboards/mrc.yaml, $D/mrc-overview.json"
echo "restart Grafana to load them (systemctl restart grafana-server)"
