# The build users deploy, defined once. scripts/bundle.sh builds it for the
# GPU machine and scripts/test.sh's first stage builds and tests it, both
# through this file, so what CI tests is what ships. Sourced, not run:
#
#   . scripts/release_build.sh
#   wsup_release_configure [CUDA]   # CUDA: AUTO (default) or ON (fail without the toolkit)
#   cmake --build "$WSUP_RELEASE_DIR" -j"$(nproc)"
#
# What it is: CMAKE_BUILD_TYPE=Release (-O3 -DNDEBUG), warnings as errors,
# Debian's GCC (/usr/bin/gcc, /usr/bin/g++, also as nvcc's host compiler),
# whatever CC and CXX say; the cuda backend and engine when the CUDA toolkit
# is found (sm_90 unless CMAKE_CUDA_ARCHITECTURES is given); the test
# checkpoints from $WSUP_TESTDATA_DIR, else testdata/ in the repository. Run from the repository root.

WSUP_RELEASE_DIR=build-release

wsup_release_configure() {
  local cuda=${1:-AUTO}
  cmake -S . -B "$WSUP_RELEASE_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DWSUP_WERROR=ON \
    -DWSUP_CUDA="$cuda" \
    -DCMAKE_C_COMPILER=/usr/bin/gcc \
    -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
    -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
    -DWSUP_TESTDATA_DIR="${WSUP_TESTDATA_DIR:-$PWD/testdata}" >/dev/null
}
