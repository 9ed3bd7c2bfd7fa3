#!/bin/sh
# Install mrc's Grafana provisioning: the Prometheus data source, the dashboard provider and the MRC
# overview dashboard (docs/daemon.md, "Metrics"). Grafana reads provisioning at start: restart it after.
#
#   deploy/grafana/install.sh [--provisioning DIR] [--dashboards DIR] [--prometheus URL]
#
# Defaults: Debian/RPM Grafana's /etc/grafana/provisioning, dashboards in /var/lib/grafana/dashboards/mrc,
# Prometheus at http://127.0.0.1:9090. The provider's path is rewritten to the dashboards folder and the
# data source's url to the Prometheus URL. Files are written with mode 0644; nothing else is touched.
set -eu

here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
prov=/etc/grafana/provisioning
dash=/var/lib/grafana/dashboards/mrc
prom=http://127.0.0.1:9090

usage() { sed -n '5p' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --provisioning) [ $# -ge 2 ] || usage; prov=$2; shift 2 ;;
    --dashboards) [ $# -ge 2 ] || usage; dash=$2; shift 2 ;;
    --prometheus) [ $# -ge 2 ] || usage; prom=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage ;;
  esac
done
case "$dash" in /*) ;; *) echo "install.sh: --dashboards must be an absolute path (Grafana reads it)" >&2; exit 2 ;; esac
case "$prom" in *'|'*) echo "install.sh: --prometheus must not contain '|'" >&2; exit 2 ;; esac
case "$dash" in *'|'*) echo "install.sh: --dashboards must not contain '|'" >&2; exit 2 ;; esac

install -d -m 0755 "$prov/datasources" "$prov/dashboards" "$dash"
sed "s|^\( *url:\).*|\1 $prom|" "$here/provisioning/datasources/mrc.yaml" > "$prov/datasources/mrc.yaml.tmp"
sed "s|^\( *path:\).*|\1 $dash|" "$here/provisioning/dashboards/mrc.yaml" > "$prov/dashboards/mrc.yaml.tmp"
chmod 0644 "$prov/datasources/mrc.yaml.tmp" "$prov/dashboards/mrc.yaml.tmp"
mv "$prov/datasources/mrc.yaml.tmp" "$prov/datasources/mrc.yaml"
mv "$prov/dashboards/mrc.yaml.tmp" "$prov/dashboards/mrc.yaml"
install -m 0644 "$here/dashboards/mrc-overview.json" "$dash/mrc-overview.json"
echo "installed: $prov/datasources/mrc.yaml (Prometheus $prom), $prov/dashboards/mrc.yaml, $dash/mrc-overview.json"
echo "restart Grafana to load them (systemctl restart grafana-server)"
