#!/usr/bin/env bash
# llama.cpp built once, for the app and for the peer bench: llama-cpp-python (the library `pip install -e .` builds,
# with the same defaults) from its sdist in a kept build folder, then llama-server and llama-perplexity from that same
# folder, so that only their own sources compile (ggml and llama are reused). Both land in the active virtualenv:
# llama-cpp-python as a package, the two binaries linked into its bin/ (on PATH, where bench.peer finds them).
#
#   bash scripts/build_llama_tools.sh            # from the repository root, in the virtualenv; JOBS=2 by default
#
# Needs cmake and ninja (Debian: cmake ninja-build) and a C++ compiler (build-essential). The build folder is
# $LLAMA_BUILD_DIR (default .build/, ignored by git); the binaries link to its libraries, so keep it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
BUILD=$(realpath -m "${LLAMA_BUILD_DIR:-.build}")
SRC="$BUILD/llama_cpp_python-$VERSION"
mkdir -p "$BUILD"
if [ ! -d "$SRC" ]; then
  pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$BUILD"
  tar xzf "$BUILD/llama_cpp_python-$VERSION.tar.gz" -C "$BUILD"
fi
# 1. the app's library as `pip install -e .` builds it (llama-cpp-python's defaults, said again: the folder may hold
#    step 2's), in a folder that is kept
CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=ON" pip install --no-deps --force-reinstall "$SRC" --config-settings=build-dir="$BUILD/llama-cpp"
# 2. the same folder configured for the server and its tools (the Web UI off: nothing to download), and only the
#    two binaries built; llama-cpp-python's own mtmd target gives way to llama.cpp's tools/mtmd
cmake -S "$SRC" -B "$BUILD/llama-cpp" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAVA_BUILD=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$BUILD/llama-cpp" --target llama-server llama-perplexity -j "${JOBS:-2}"
BIN=$(dirname "$(command -v python)")
ln -sf "$BUILD/llama-cpp/bin/llama-server" "$BUILD/llama-cpp/bin/llama-perplexity" "$BIN/"
echo "llama-cpp-python $VERSION; $("$BIN/llama-server" --version 2>&1 | head -1); in $BIN"
