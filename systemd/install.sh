#!/bin/sh
# Install mmd as a systemd service: systemd/install.sh [VENV] [SOURCE]   (as root; `make install-service`)
#
#   VENV    where mmd is installed, not editable (default /opt/mmd/venv)
#   SOURCE  the clone it is installed from (default: this script's repository)
#
# Idempotent: run it again to upgrade mmd in place (then `systemctl restart mmd`).
set -eu
venv=${1:-/opt/mmd/venv}
src=$(cd "${2:-$(dirname "$0")/..}" && pwd)
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }

# The source the unit's Documentation= names, and the venv with a plain (non-editable) install.
install -d -m 0755 /opt/mmd
[ "$src" = /opt/mmd/src ] || { rm -rf /opt/mmd/src; cp -a "$src" /opt/mmd/src; rm -rf /opt/mmd/src/.venv; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
extra=""
command -v nvcc >/dev/null 2>&1 && extra="[cuda]"   # pycuda builds against the CUDA toolkit
"$venv/bin/pip" install -q "/opt/mmd/src$extra"

# The user, its group (the people who may drop files) and the spool.
getent group mmd-spool >/dev/null || groupadd --system mmd-spool
id -u mmd >/dev/null 2>&1 || useradd --system --gid mmd-spool --home-dir /var/lib/mmd --shell /usr/sbin/nologin mmd
! getent group video >/dev/null || usermod -aG video mmd
install -d -o mmd -g mmd-spool -m 3730 /srv/mmd/inbox    # setgid + sticky, no read: users drop, never list; only mmd moves
install -d -o mmd -g mmd-spool -m 2750 /srv/mmd/outbox   # users read results
install -d -o mmd -g mmd-spool -m 0700 /srv/mmd/state    # the lock, the state, claimed and archived jobs: mmd's alone
install -d -o root -g mmd-spool -m 0750 /etc/mmd
if [ ! -e /etc/mmd/mmd.yaml ]; then
    printf 'inbox: /srv/mmd/inbox\noutbox: /srv/mmd/outbox\nstate_dir: /srv/mmd/state\nclass_mode: true\nbackend: auto\n' \
        > /etc/mmd/mmd.yaml
    chgrp mmd-spool /etc/mmd/mmd.yaml && chmod 0640 /etc/mmd/mmd.yaml
fi

# The unit; systemd makes /var/lib/mmd and /var/cache/mmd (StateDirectory=, CacheDirectory=).
install -m 0644 /opt/mmd/src/systemd/mmd.service /etc/systemd/system/mmd.service
systemctl daemon-reload
echo "installed mmd $("$venv/bin/mmd" --version) in $venv; start it with: systemctl enable --now mmd"
