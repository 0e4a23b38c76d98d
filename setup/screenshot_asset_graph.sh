#!/usr/bin/env bash
# Screenshot of the asset graph as `dagster dev` shows it: starts the Dagster webserver on
# a free loopback port over workspace.yaml, waits for it, and has headless Chromium
# (Debian's `chromium`, installed when missing) save docs/asset_graph.png.
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
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$(mktemp -d)" --window-size=1600,1000 --virtual-time-budget=30000 \
  --screenshot="$PWD/docs/asset_graph.png" "http://127.0.0.1:$port/locations/binlog_assets.definitions/asset-groups/binlake"
echo "saved docs/asset_graph.png"
