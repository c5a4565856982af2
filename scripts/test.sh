#!/usr/bin/env bash
# Builds wsup and runs every test: first the build users deploy (the Release
# tree scripts/bundle.sh ships, defined once in scripts/release_build.sh:
# -O3, warnings as errors, Debian's GCC, the cuda backend when the toolkit is
# found) and its tests, then an ASan+UBSan build (clang) of the tests and the
# fuzz targets, clang-tidy on the files the latest commit touched, then
# each fuzz target for a bounded time. GPU tests skip with a message when no GPU is
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

# The sanitizer tree is built with clang: at -O0 with ASan and UBSan it
# compiles the suite in about half GCC's time, and lld links its large
# instrumented executables in a fraction of ld's. The same tree builds the
# libFuzzer targets (WSUP_FUZZ), so the fuzzed libraries are compiled once.
# Line tables (not full debug info) are enough for sanitizer reports.
stage_begin "build (ASan+UBSan, fuzz)"
# A tree configured with another compiler (older checkouts built it with GCC)
# is started again: CMake keeps the compiler a tree was first made with.
if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' build-asan/CMakeCache.txt; then
  rm -rf build-asan
fi
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld \
  -DWSUP_SANITIZE=address,undefined -DWSUP_FUZZ=ON -DWSUP_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
stage_end
# clang-tidy (.clang-tidy) on the sources the latest commit touched, read
# through the clang tree's compile commands; `scripts/tidy.sh all` checks
# every file.
stage_begin "clang-tidy (changed files)"
bash scripts/tidy.sh "${WSUP_TIDY_BASE:-HEAD~1}" build-asan
stage_end
stage_begin "tests under ASan+UBSan"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" --timeout 900)
stage_end

# Each fuzz target runs for a bounded time, as many at once as there are
# cores (libFuzzer uses one each); a target that crashes fails the stage
# after every target has run, with the end of its log. The stage has a
# fixed wall budget (WSUP_FUZZ_BUDGET, 90 s), shared by the targets: a new
# target shortens the others' runs (never below 20 s) rather than
# lengthening CI.
stage_begin "fuzz (bounded)"
fuzz_budget=${WSUP_FUZZ_BUDGET:-90}
fuzz_one() {
  local f=$1 name corpus
  name=$(basename "$f")
  corpus="fuzz/corpus/${name%_fuzz}"
  mkdir -p "build-asan/corpus-$name"
  "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -print_final_stats=1 "build-asan/corpus-$name" \
    $( [ -d "$corpus" ] && echo "$corpus" ) > "build-asan/fuzz/$name.log" 2>&1
  echo $? > "build-asan/fuzz/$name.rc"
}
export -f fuzz_one
export fuzz_seconds
fuzzers=()
for f in build-asan/fuzz/*_fuzz; do
  [ -x "$f" ] && fuzzers+=("$f")
done
if [ ${#fuzzers[@]} -eq 0 ]; then
  echo "fuzz: no fuzz targets were built in build-asan/fuzz" >&2
  exit 1
fi
waves=$(( (${#fuzzers[@]} + jobs - 1) / jobs ))
fuzz_seconds=$(( fuzz_budget / waves ))
[ "$fuzz_seconds" -ge 20 ] || fuzz_seconds=20
rm -f build-asan/fuzz/*.rc
printf '%s\n' "${fuzzers[@]}" | xargs -P "$jobs" -I{} bash -c 'fuzz_one "$1"' _ {}
fuzz_failed=0
for f in "${fuzzers[@]}"; do
  name=$(basename "$f")
  rc=$(cat "build-asan/fuzz/$name.rc" 2>/dev/null || echo "missing")
  echo "-- $name ($fuzz_seconds s): exit $rc"
  tail -n 12 "build-asan/fuzz/$name.log"
  [ "$rc" = "0" ] || fuzz_failed=1
done
if [ "$fuzz_failed" -ne 0 ]; then
  echo "fuzz: a target crashed or failed (its log is above, in full under build-asan/fuzz/)" >&2
  exit 1
fi
echo "fuzz: all ${#fuzzers[@]} targets ran without a crash"
stage_end
