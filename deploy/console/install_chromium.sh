#!/usr/bin/env bash
# Installs Chromium from Debian's packages for the web console's browser tests (tests/console/test_console_browser.py drives
# it with Playwright; Playwright's own browser download is never used). A no-op when a Chromium is already there.
#
#   bash deploy/console/install_chromium.sh          # as root: apt-get install chromium
#   CHROMIUM=/path/to/chromium .venv/bin/python -m pytest tests/console/test_console_browser.py   # another build
#
# Needs apt (Debian/Ubuntu) and root; `apt-get update` runs first when the package lists lack `chromium`.
set -euo pipefail

for c in "${CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
  if [ -n "$c" ] && [ -x "$c" ]; then
    echo "chromium: $c ($("$c" --version 2>/dev/null | head -1))"
    exit 0
  fi
done

if ! command -v apt-get > /dev/null 2>&1; then
  echo "install_chromium: no apt-get here; install Chromium from your distribution and set CHROMIUM=/path/to/it" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "install_chromium: /usr/bin/chromium is missing and installing it needs root: run" >&2
  echo "  sudo apt-get install -y chromium" >&2
  echo "(or set CHROMIUM=/path/to/a/chromium for the browser tests)" >&2
  exit 1
fi
if ! apt-cache show chromium > /dev/null 2>&1; then
  apt-get update -qq
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium > /dev/null
echo "chromium: installed /usr/bin/chromium ($(/usr/bin/chromium --version 2>/dev/null | head -1))"
