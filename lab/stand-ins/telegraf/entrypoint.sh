#!/bin/bash
# As the official telegraf image: options alone run telegraf with them; root drops to telegraf.
set -e
if [ "${1:0:1}" = '-' ]; then
  set -- telegraf "$@"
fi
if [ "$(id -u)" -ne 0 ]; then
  exec "$@"
fi
exec setpriv --reuid telegraf --regid telegraf --clear-groups "$@"
