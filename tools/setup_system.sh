#!/usr/bin/env bash
# Debian packages the project needs: chromium (browser tests, the page), mesa-vulkan-drivers (lavapipe:
# a CPU Vulkan device for wgpu in tests). Installed when missing if we are root; otherwise say what to install.
set -euo pipefail
# Node.js builds the page (Vite) and runs npm ci; Debian's own is too old for Vite, so it is not installed here.
if ! command -v npm >/dev/null 2>&1 || ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)'; then
  echo "webgguf needs Node.js >= 20.19 with npm (https://nodejs.org/ or NodeSource packages)" >&2
  exit 1
fi
missing=()
# The browser tests launch Debian's chromium at /usr/bin/chromium (tests/e2e/conftest.py CHROMIUM): another
# chromium on the PATH (a snap, a download) is not the one they run.
[ -x /usr/bin/chromium ] || missing+=(chromium)
for pkg in mesa-vulkan-drivers libvulkan1; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "webgguf needs these Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
