#!/bin/bash
# As the official influxdb:1.x image: options alone run influxd with them; influxd runs the
# first-start set-up, then becomes PID 1.
set -e
if [ "${1:0:1}" = '-' ]; then
  set -- influxd "$@"
fi
if [ "$1" = 'influxd' ]; then
  /init-influxdb.sh "${@:2}"
fi
exec "$@"
