#!/usr/bin/env bash
# The hardening soak: sets up what is missing, then runs `approxy bench soak` three times
# (about 45 minutes): the approximate path over the real llama-server for 30 minutes at 2
# concurrent clients, then passthrough over a stub upstream at 500 req/s for 100,000 requests
# (10 % of the clients leave mid-request in both), then 10 minutes of 500 idle connections, 64
# slow-body clients and 20 normal streaming clients at once. Reports: tests/bench/results/soak-*.json.
# Exit status 1 when a goal is missed (a failed or hung request, a resource that grew, work left
# running, an attacker kept past its deadline, a normal client refused).
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
OUT="${SOAK_OUT:-tests/bench/results}"
status=0
"$APPROXY" bench soak --phase approximate --minutes "${SOAK_MINUTES:-30}" --out "$OUT" || status=1
"$APPROXY" bench soak --phase passthrough --requests "${SOAK_REQUESTS:-100000}" --rate 500 --out "$OUT" || status=1
"$APPROXY" bench soak --phase attack --minutes "${SOAK_ATTACK_MINUTES:-10}" --out "$OUT" || status=1
exit $status
