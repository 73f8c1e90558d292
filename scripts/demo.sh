#!/bin/sh
# `make demo`: drop a generated sample into inbox/, serve the inbox once, show the job it just ran.
#
# Run again, the new sample's results go to outbox/sample.1.* (mmd never overwrites an output): what is
# shown is always this run's job, as the daemon's state file lists it. MMD names the command
# (default .venv/bin/mmd).
set -eu
MMD=${MMD:-.venv/bin/mmd}

mkdir -p inbox outbox
test -e inbox/sample.txt || $MMD gen 64 --seed 1 -o inbox/sample.txt
MMD_LOG_LEVEL=warning $MMD serve --once

# The job just served: the first of the state file's recent jobs (mmd status --json exits 3: not serving).
last=$($MMD status --json | python3 -c '
import json, sys
job = (json.load(sys.stdin).get("state") or {}).get("recent", [{}])[0]
print(job.get("status", ""), job.get("output") or "", job.get("sidecar") or "")
' || true)
set -- $last
if [ "${1:-}" = ok ]; then
    echo "--- outbox/$2 (first lines):"
    head -n 3 "outbox/$2"
else
    echo "--- the job was refused; its error sidecar says why"
fi
echo "--- outbox/$3:"
cat "outbox/$3"
