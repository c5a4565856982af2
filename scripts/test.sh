#!/usr/bin/env bash
# Builds wsup and runs every test: the normal build, then an ASan+UBSan build
# of the tests, then each fuzz target for a bounded time. GPU tests skip with
# a message when no GPU is present. Usage: scripts/test.sh [--quick]
#   --quick: the normal build and its tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

echo "== build (RelWithDebInfo) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
echo "== tests =="
(cd build && ctest --output-on-failure -j"$jobs" --timeout 600)

if [ "${1:-}" = "--quick" ]; then exit 0; fi

echo "== build (ASan+UBSan) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWSUP_SANITIZE=address,undefined \
  -DWSUP_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
echo "== tests under ASan+UBSan =="
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" --timeout 900)

echo "== fuzz (bounded) =="
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWSUP_FUZZ=ON \
  -DWSUP_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target wsup_fuzz_all
for f in build-fuzz/fuzz/*_fuzz; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  corpus="fuzz/corpus/${name%_fuzz}"
  mkdir -p "build-fuzz/corpus-$name"
  echo "-- $name (60 s)"
  "$f" -max_total_time=60 -rss_limit_mb=2048 -print_final_stats=1 "build-fuzz/corpus-$name" \
    $( [ -d "$corpus" ] && echo "$corpus" ) 2>&1 | tail -n 12
done
echo "fuzz: all targets ran without a crash"
