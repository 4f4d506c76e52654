#!/usr/bin/env bash
# An MLflow tracking server for Raylane: runs and metrics in a database, artifacts (events.jsonl, checkpoints'
# metadata) served by the server itself, so that every node of a Ray cluster only needs to reach one URL.
#
#   deploy/mlflow/run_server.sh [STATE_DIR]          # sqlite STATE_DIR/mlflow.db, artifacts in STATE_DIR/artifacts
#   export RAYLANE_MLFLOW_URI=http://HOST:5000       # on every Ray node, before `ray start` (docs/deploy.md)
#
# MLflow 3 refuses file:// stores, hence sqlite (one server, a handful of concurrent writers) or postgres (many):
#   RAYLANE_MLFLOW_BACKEND=postgresql://mlflow:PASSWORD@db:5432/mlflow deploy/mlflow/run_server.sh
#   (needs `pip install psycopg2-binary` next to mlflow)
# Artifacts can go to object storage instead of the local directory (the server proxies them):
#   RAYLANE_MLFLOW_ARTIFACTS=s3://bucket/raylane/mlflow deploy/mlflow/run_server.sh      (needs boto3)
#
# Settings (environment): RAYLANE_MLFLOW_BACKEND, RAYLANE_MLFLOW_ARTIFACTS, RAYLANE_MLFLOW_HOST (0.0.0.0),
# RAYLANE_MLFLOW_PORT (5000), RAYLANE_MLFLOW_WORKERS (2; keep it low with sqlite), MLFLOW (the mlflow executable).
# MLflow only answers requests whose Host header is localhost or a private IP unless told otherwise: clients that
# use a DNS name (a Kubernetes Service, say) need MLFLOW_SERVER_ALLOWED_HOSTS="name*,localhost*" (fnmatch patterns).
#
# The server asks for no login: anyone who reaches the port reads and writes every team's runs (docs/security.md).
# Keep it on the cluster's private network. Its database and artifacts are readable by this user only (umask 077).
set -euo pipefail
umask 077

dir="${1:-${RAYLANE_MLFLOW_DIR:-$HOME/.raylane/mlflow-server}}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
backend="${RAYLANE_MLFLOW_BACKEND:-sqlite:///$dir/mlflow.db}"
artifacts="${RAYLANE_MLFLOW_ARTIFACTS:-$dir/artifacts}"

mlflow_bin="${MLFLOW:-}"
if [ -z "$mlflow_bin" ]; then
  # The mlflow next to this checkout's venv, else the one on PATH.
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  if [ -x "$here/.venv/bin/mlflow" ]; then mlflow_bin="$here/.venv/bin/mlflow"; else mlflow_bin="mlflow"; fi
fi

echo "mlflow server: backend $backend, artifacts $artifacts, http://${RAYLANE_MLFLOW_HOST:-0.0.0.0}:${RAYLANE_MLFLOW_PORT:-5000}" >&2
exec "$mlflow_bin" server \
  --backend-store-uri "$backend" \
  --serve-artifacts --artifacts-destination "$artifacts" \
  --host "${RAYLANE_MLFLOW_HOST:-0.0.0.0}" \
  --port "${RAYLANE_MLFLOW_PORT:-5000}" \
  --workers "${RAYLANE_MLFLOW_WORKERS:-2}"
