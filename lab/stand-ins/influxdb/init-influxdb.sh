#!/bin/bash
# The official influxdb:1.x image's first start, the part docker-compose.yml uses: when the data
# folder has no metadata yet and INFLUXDB_ADMIN_USER is set, a temporary influxd on loopback makes
# that admin with INFLUXDB_ADMIN_PASSWORD, then stops. Later starts do nothing here.
set -e
[ -d /var/lib/influxdb/meta ] && exit 0
[ -n "$INFLUXDB_ADMIN_USER" ] || exit 0
INIT_PORT="${INFLUXDB_INIT_PORT:-8086}"
INFLUXDB_HTTP_BIND_ADDRESS="127.0.0.1:$INIT_PORT" INFLUXDB_HTTP_HTTPS_ENABLED=false influxd "$@" &
pid=$!
for _ in $(seq 1 30); do
  influx -host 127.0.0.1 -port "$INIT_PORT" -execute "SHOW DATABASES" > /dev/null 2>&1 && break
  sleep 1
done
# InfluxDB takes one user creation without credentials while it has no user: that one is the admin
influx -host 127.0.0.1 -port "$INIT_PORT" -execute \
  "CREATE USER \"$INFLUXDB_ADMIN_USER\" WITH PASSWORD '$INFLUXDB_ADMIN_PASSWORD' WITH ALL PRIVILEGES"
kill -s TERM "$pid"
wait "$pid" || true
echo "influxdb init: admin $INFLUXDB_ADMIN_USER made"
