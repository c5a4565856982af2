#!/usr/bin/env bash
# Installs, from Debian's packages and only if missing, everything wsup needs
# to build, test and benchmark. Safe to run again: it does nothing when all is
# present. CUDA and NCCL are optional; when the toolkit is found the cuda
# backend is built as well.
set -euo pipefail

pkgs=(
  cmake ninja-build g++ clang pkg-config git
  libuv1-dev libsqlite3-dev sqlite3 libspdlog-dev libfmt-dev libtomlplusplus-dev
  catch2 nlohmann-json3-dev libcli11-dev libsystemd-dev libhttp-parser-dev
  libssl-dev libclang-rt-14-dev lld clang-tidy
  python3 python3-numpy python3-pytest libdlpack-dev
  curl haproxy wrk systemd
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# node.js and npm (Debian's) for the openai client check in tests/openai; a
# node.js already on the PATH (another packaging of it) is used as it is.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# The official openai npm package, at the version package-lock.json pins
# (not vendored; node_modules is ignored by git). Installed again only when
# the lock file changed.
openai_dir="$(dirname "$0")/../tests/openai"
if [ ! -f "$openai_dir/node_modules/openai/package.json" ] ||
   [ "$openai_dir/package-lock.json" -nt "$openai_dir/node_modules/.package-lock.json" ]; then
  echo "setup: npm ci in tests/openai"
  (cd "$openai_dir" && npm ci --no-audit --no-fund --loglevel=error)
else
  echo "setup: tests/openai/node_modules present"
fi
