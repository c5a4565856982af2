#!/usr/bin/env bash
# Builds wsup and runs every test: first the build users deploy (the Release
# tree scripts/bundle.sh ships, defined once in scripts/release_build.sh:
# -O3, warnings as errors, Debian's GCC, the cuda backend when the toolkit is
# found) and its tests, then an ASan+UBSan build of the tests, then each fuzz
# target for a bounded time. GPU tests skip with a message when no GPU is
# present. Each stage's wall time is printed at the end (also when a stage
# fails). Usage: scripts/test.sh [--quick]
#   --quick: the Release build and its tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
. scripts/release_build.sh

stage_names=()
stage_secs=()
stage_start=0
current=""
stage_begin() {
  current=$1
  stage_start=$(date +%s)
  echo "== $current =="
}
stage_end() {
  stage_names+=("$current")
  stage_secs+=($(($(date +%s) - stage_start)))
  current=""
}
print_stage_times() {
  local total=0 i
  echo "== wall time per stage =="
  for i in "${!stage_names[@]}"; do
    printf '  %-28s %6d s\n' "${stage_names[$i]}" "${stage_secs[$i]}"
    total=$((total + stage_secs[i]))
  done
  if [ -n "$current" ]; then
    local t=$(($(date +%s) - stage_start))
    printf '  %-28s %6d s (failed)\n' "$current" "$t"
    total=$((total + t))
  fi
  printf '  %-28s %6d s\n' "total" "$total"
}
trap print_stage_times EXIT

stage_begin "build (Release)"
wsup_release_configure AUTO
cmake --build "$WSUP_RELEASE_DIR" -j"$jobs"
stage_end
stage_begin "tests (Release)"
(cd "$WSUP_RELEASE_DIR" && ctest --output-on-failure -j"$jobs" --timeout 600)
stage_end

if [ "${1:-}" = "--quick" ]; then exit 0; fi

stage_begin "build (ASan+UBSan)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWSUP_SANITIZE=address,undefined \
  -DWSUP_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
stage_end
stage_begin "tests under ASan+UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" --timeout 900)
stage_end

stage_begin "fuzz (bounded)"
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
stage_end
