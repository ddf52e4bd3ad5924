#!/usr/bin/env bash
# Every test: the suite in a normal build, then the whole suite again under AddressSanitizer
# and UndefinedBehaviorSanitizer (with clang, also short libFuzzer runs of the spec parser and
# of the checkpoint and import-hf readers).
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -B build -S . >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
if command -v clang >/dev/null; then cc=clang fuzz=ON; else cc=cc fuzz=OFF; fi
CC=$cc cmake -B build-asan -S . -DCMAKE_BUILD_TYPE=Debug -DMTC_SANITIZE=ON -DMTC_FUZZ=$fuzz >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs"
echo "all tests passed (normal build and ASan+UBSan build, fuzz=$fuzz)"
