#!/usr/bin/env bash
# System packages the stack needs, installed from Debian's archive only when missing:
# a JDK 17+ (Kafka 4 and Spark 4), Maven (resolves the jars from Maven Central), and
# MariaDB server + client (the binlog source; binlake runs its own mariadbd, not the
# packaged service), Redis (the handler example's cache; its own redis-server too) and
# Percona Toolkit (an online schema change tool, for a drill); libmariadb-dev, pkg-config,
# gcc and the Python headers build mysqlclient.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
# mariadbd is in /usr/sbin, outside a non-root PATH.
PATH="$PATH:/usr/sbin" command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || need+=(mariadb-client)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# pt-online-schema-change, whose table swap the schema-change drill replicates.
command -v pt-online-schema-change >/dev/null 2>&1 || need+=(percona-toolkit)
# PostgreSQL: the Dagster instance's production storage, for the soak and its test.
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# mysqlclient (an initial load's reads) builds against libmariadb with a C compiler.
pkg-config --exists libmariadb 2>/dev/null || need+=(libmariadb-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
test -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" \
  || need+=(python3-dev)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi
