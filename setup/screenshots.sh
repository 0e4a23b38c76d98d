#!/usr/bin/env bash
# Screenshots of the pages the README shows, as `dagster dev` renders them after
# `make demo`: starts the Dagster webserver on a free loopback port over workspace.yaml
# and the local instance, waits for it, and has headless Chromium (Debian's `chromium`,
# installed when missing) save each page into docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/var/dagster}"
port=$(.venv/bin/python -c 'from binlog_assets.dev.process import free_port; print(free_port())')
.venv/bin/dagster-webserver -w workspace.yaml -h 127.0.0.1 -p "$port" > var/webserver.log 2>&1 &
web=$!
trap 'kill $web 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/server_info" >/dev/null && break
  sleep 1
done
mkdir -p docs
shoot() {  # shoot FILE PATH: one page, after its data has loaded
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d)" --window-size=1600,1100 --virtual-time-budget=60000 \
    --screenshot="$PWD/docs/$1" "http://127.0.0.1:$port$2" 2>/dev/null
  echo "saved docs/$1"
}
shoot asset_graph.png "/locations/binlake/asset-groups/binlake"
shoot changelog.png "/assets/changelog"
shoot kafka_source.png "/assets/kafka/shop"
shoot replica.png "/assets/replica/customers"
