#!/usr/bin/env bash
# Installs promtool (Prometheus' rule checker and rule unit-test runner), which tests/deploy/test_deploy.py runs on
# deploy/prometheus/. No PyPI package ships it, so it comes from Debian's `prometheus` package: the .deb is
# downloaded (about 19 MB) and only its promtool binary (about 48 MB) is kept, so no Prometheus server is installed
# or started. A no-op when a promtool is already on PATH or in the target directory.
#
#   bash deploy/prometheus/install_promtool.sh            # into /usr/local/bin (root) or ~/.local/bin
#   PROMTOOL_DIR=.venv/bin bash deploy/prometheus/install_promtool.sh
#
# Needs apt (Debian/Ubuntu); `apt-get update` runs first when the package lists lack `prometheus` (as root).
set -euo pipefail

if [ -z "${PROMTOOL_DIR:-}" ]; then
  if [ -w /usr/local/bin ]; then PROMTOOL_DIR=/usr/local/bin; else PROMTOOL_DIR="$HOME/.local/bin"; fi
fi

if [ -x "$PROMTOOL_DIR/promtool" ]; then
  echo "promtool: $PROMTOOL_DIR/promtool ($("$PROMTOOL_DIR/promtool" --version 2>&1 | head -1))"
  exit 0
fi
if command -v promtool > /dev/null 2>&1; then
  echo "promtool: $(command -v promtool) ($(promtool --version 2>&1 | head -1))"
  exit 0
fi

if ! command -v apt-get > /dev/null 2>&1; then
  echo "install_promtool: no apt-get here; install promtool from your distribution's prometheus package" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt's download user must be able to write there, or apt warns that it downloads unsandboxed.
chmod 0777 "$work"
cd "$work"
if ! apt-cache show prometheus > /dev/null 2>&1; then
  apt-get update -qq
fi
apt-get download -qq prometheus
deb="$(ls prometheus_*.deb)"
dpkg-deb --fsys-tarfile "$deb" | tar -x ./usr/bin/promtool
mkdir -p "$PROMTOOL_DIR"
install -m 0755 usr/bin/promtool "$PROMTOOL_DIR/promtool"
echo "promtool: installed $PROMTOOL_DIR/promtool from $deb ($("$PROMTOOL_DIR/promtool" --version 2>&1 | head -1))"
case ":$PATH:" in
  *":$PROMTOOL_DIR:"*) ;;
  *) echo "promtool: $PROMTOOL_DIR is not on PATH; tests/deploy/test_deploy.py also finds it with PROMTOOL=$PROMTOOL_DIR/promtool" >&2 ;;
esac
