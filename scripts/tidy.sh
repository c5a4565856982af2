#!/usr/bin/env bash
# Runs clang-tidy, with the checks .clang-tidy names, on the project's C++
# sources a change touches, or on all of them. Any finding fails the run
# (WarningsAsErrors), with the file, the line and the check's name.
#
#   scripts/tidy.sh [BASE|all] [BUILD_DIR]
#
# BASE: a revision; the files changed between it and the working tree are
#   checked. Default HEAD~1 (what the latest commit touched; a merge's first
#   parent, so a merged branch is checked whole). "all" checks every source.
# BUILD_DIR: a tree whose compile_commands.json gives each file's flags.
#   Default build-tidy, configured here (clang, no cuda; configuring is
#   enough, nothing is built) when it has none. The test script passes its
#   clang tree, build-asan.
# A changed header is checked through its own .cc when there is one, and
# through every checked .cc that includes it (HeaderFilterRegex).
# Only the product's sources are checked (not tests/, bench/, fuzz/ or
# examples/): the test frameworks' macros expand into code these checks
# were not written for.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
build=${2:-build-tidy}
tidy=$(command -v clang-tidy || command -v clang-tidy-14 || true)
if [ -z "$tidy" ]; then
  echo "tidy: clang-tidy is not installed; run scripts/setup.sh" >&2
  exit 2
fi
if [ ! -f "$build/compile_commands.json" ]; then
  if [ "$build" != "build-tidy" ]; then
    echo "tidy: $build/compile_commands.json is missing; configure that tree first (cmake -S . -B $build)" >&2
    exit 2
  fi
  echo "tidy: configuring $build (compile commands only)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DWSUP_CUDA=OFF >/dev/null
fi

product='^(common|text|checkpoint|wire|http|state|probes|holder|client|engine|front|supervisor|gpu)/'
if [ "$base" = "all" ]; then
  changed=$(git ls-files '*.cc' '*.h')
elif git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  changed=$(git diff --name-only --diff-filter=AMR "$base" -- '*.cc' '*.h')
else
  echo "tidy: $base is not a commit here (a shallow clone?); checking every source"
  changed=$(git ls-files '*.cc' '*.h')
fi

# The .cc files to run on: the changed ones, and the .cc beside a changed
# header; only those the tree compiles (the cuda backend's sources are
# absent from a tree built without it).
files=()
while IFS= read -r f; do
  [ -n "$f" ] || continue
  [[ "$f" =~ $product ]] || continue
  case "$f" in
    *.h) f="${f%.h}.cc" ;;
  esac
  [ -f "$f" ] || continue
  grep -q "\"file\": \"$PWD/$f\"" "$build/compile_commands.json" || continue
  files+=("$f")
done <<< "$changed"
mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u | sed '/^$/d')

if [ ${#files[@]} -eq 0 ]; then
  echo "tidy: no product source changed since $base; nothing to check"
  exit 0
fi
echo "tidy: ${#files[@]} file(s) changed since $base"
# -Wno-unknown-warning-option: a tree configured with GCC passes warning
# flags clang does not know.
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc)" -n 4 "$tidy" -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option
echo "tidy: clean"
