#!/usr/bin/env bash
# Builds the Release tree that scripts/test.sh tests (scripts/release_build.sh:
# -O3, warnings as errors, Debian's GCC), with the cuda backend required, and
# collects the programs, the test binaries and the shared libraries a GPU
# node may lack (libuv, spdlog, toml++, http-parser, and the tokenizer's
# PCRE2, utf8proc and Abseil) into one folder, so the
# tests and benchmarks can run on a GPU node that has the NVIDIA driver but
# none of the -dev packages. After `scripts/test.sh` the tree is built
# already and this only collects it.
#
#   scripts/bundle.sh OUTDIR
#   # on the GPU node:
#   OUTDIR/run.sh OUTDIR/tests/mapping_test '[gpu]'
#   OUTDIR/run.sh OUTDIR/tests/holder_layout_cuda_test '[gpu]'
#   OUTDIR/run.sh python3 OUTDIR/python/gpu_layout_check.py --holder OUTDIR/bin/wsup-holder \
#       --lib OUTDIR/lib/libwsup_client.so --testdata OUTDIR/testdata
# The Python client (wsup_client) and the GPU check scripts of tests/python
# are in OUTDIR/python: each script finds the package beside it.
# The test checkpoints (the repository's testdata/) are copied into
# OUTDIR/testdata, and run.sh points WSUP_TESTDATA_DIR there unless it is
# set: the bundle runs wherever it is copied to.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/bundle.sh OUTDIR}
. scripts/release_build.sh
wsup_release_configure ON
cmake --build "$WSUP_RELEASE_DIR" -j"$(nproc)"
build=$WSUP_RELEASE_DIR
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/lib"
cp -r testdata "$out/testdata"
cp "$build"/bin/* "$out/bin/"
cp "$build"/tests/*_test "$out/tests/" 2>/dev/null || true
cp "$build"/lib/libwsup_client.so "$out/lib/" 2>/dev/null || true
mkdir -p "$out/python"
cp -r client/python/wsup_client "$out/python/"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
# (gpu_example_engine_check.py runs from a checkout: it starts examples/.)
cp tests/python/gpu_layout_check.py tests/python/gpu_torch_check.py tests/python/tiny_llama.py tests/python/check_table.py "$out/python/"
strip --strip-unneeded "$out"/bin/* "$out"/tests/* "$out"/lib/libwsup_client.so 2>/dev/null || true
for f in "$out"/bin/* "$out"/tests/*; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done | sort -u | grep -E 'libuv|libspdlog|libfmt|libtomlplusplus|libhttp_parser|libcrypto|libpcre2-8|libutf8proc|libabsl_' | while read -r lib; do
  cp -L "$lib" "$out/lib/"
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs a bundled program with the bundled libraries first on the search path.
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export WSUP_BIN_DIR="${WSUP_BIN_DIR:-$here/bin}"
export WSUP_TESTDATA_DIR="${WSUP_TESTDATA_DIR:-$here/testdata}"
exec "$@"
RUN
chmod +x "$out/run.sh"
du -sh "$out"
