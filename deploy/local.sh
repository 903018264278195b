#!/usr/bin/env bash
# novelbus — multi-process local deployment (OPS-3):
#   * a NATS server with JetStream and one user per actor (deploy/nats.conf), on 127.0.0.1;
#   * PostgreSQL: $NOVELBUS_DATABASE_URL if set, else an embedded one under the data directory;
#   * the six actors as separate, supervised OS processes (`novelbus up --processes`), each
#     connecting with its own NATS user; a killed actor is restarted.
#
#   deploy/local.sh [--claims-instances 2] [--model openai:<model>]
#   . .novelbus/deploy/operator.env   # in another shell: the operator's NATS user for the CLI
#   novelbus novel create my.json && novelbus status <novel>
#
# Passwords are generated once into $NOVELBUS_HOME/passwords.env (mode 0600). Ctrl-C stops all.
set -euo pipefail
cd "$(dirname "$0")/.."
export NOVELBUS_HOME="${NOVELBUS_HOME:-$PWD/.novelbus/deploy}"
PORT="${NOVELBUS_NATS_PORT:-4222}"
BIN="${NOVELBUS_BIN:-.venv/bin}"
mkdir -p "$NOVELBUS_HOME"
umask 077

PASSWORDS="$NOVELBUS_HOME/passwords.env"
touch "$PASSWORDS" && chmod 600 "$PASSWORDS"
# One password per NATS user of deploy/nats.conf; a user added since the file was written gets one too.
for user in DRIVER CLAIMS PACKER WRITER VERIFIER USAGE OPERATOR SCHEDULER MONITOR; do
  grep -q "NOVELBUS_NATS_${user}_PASSWORD=" "$PASSWORDS" ||
    echo "export NOVELBUS_NATS_${user}_PASSWORD=$("$BIN/python" -c 'import secrets; print(secrets.token_hex(16))')" >> "$PASSWORDS"
done
# shellcheck disable=SC1090
. "$PASSWORDS"

"$BIN/nats-server" -c deploy/nats.conf -a 127.0.0.1 -p "$PORT" -sd "$NOVELBUS_HOME/jetstream" \
  -l "$NOVELBUS_HOME/nats-server.log" &
NATS_PID=$!
trap 'kill "$NATS_PID" 2>/dev/null; wait "$NATS_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (echo >/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break
  kill -0 "$NATS_PID" 2>/dev/null || { echo "nats-server did not start; see $NOVELBUS_HOME/nats-server.log" >&2; exit 1; }
  sleep 0.1
done

url() {  # url USER PASSWORD
  echo "nats://$1:$2@127.0.0.1:$PORT"
}
export NOVELBUS_NATS_URL_DRIVER="$(url driver "$NOVELBUS_NATS_DRIVER_PASSWORD")"
export NOVELBUS_NATS_URL_CLAIMS="$(url claims "$NOVELBUS_NATS_CLAIMS_PASSWORD")"
export NOVELBUS_NATS_URL_PACKER="$(url packer "$NOVELBUS_NATS_PACKER_PASSWORD")"
export NOVELBUS_NATS_URL_WRITER="$(url writer "$NOVELBUS_NATS_WRITER_PASSWORD")"
export NOVELBUS_NATS_URL_VERIFIER="$(url verifier "$NOVELBUS_NATS_VERIFIER_PASSWORD")"
export NOVELBUS_NATS_URL_USAGE="$(url usage "$NOVELBUS_NATS_USAGE_PASSWORD")"
OPERATOR_URL="$(url operator "$NOVELBUS_NATS_OPERATOR_PASSWORD")"
echo "export NOVELBUS_HOME='$NOVELBUS_HOME'" > "$NOVELBUS_HOME/operator.env"

# Without NOVELBUS_DATABASE_URL, `up` starts an embedded PostgreSQL under $NOVELBUS_HOME and
# publishes both URLs in $NOVELBUS_HOME/endpoints.json, where the CLI (with NOVELBUS_HOME) finds them.
"$BIN/novelbus" up --processes --nats-url "$OPERATOR_URL" \
  ${NOVELBUS_DATABASE_URL:+--database-url "$NOVELBUS_DATABASE_URL"} "$@"
