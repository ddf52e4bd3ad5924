#!/usr/bin/env bash
# Every test: the suite in a normal build, then again under AddressSanitizer and
# UndefinedBehaviorSanitizer the fast tests, the parsers, the checkpoint readers and writers
# (tests/CMakeLists.txt says which) and, with clang, short libFuzzer runs of the spec parser and
# of the checkpoint and import-hf readers. Prints each pass's wall time.
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc)
t0=$(date +%s)
cmake -B build -S . >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
t1=$(date +%s)
echo "normal build and tests: $((t1 - t0)) s"
if command -v clang >/dev/null; then cc=clang fuzz=ON; else cc=cc fuzz=OFF; fi
CC=$cc cmake -B build-asan -S . -DCMAKE_BUILD_TYPE=Debug -DMTC_SANITIZE=ON -DMTC_FUZZ=$fuzz >/dev/null
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan --output-on-failure -j"$jobs"
echo "sanitizer build and tests: $(($(date +%s) - t1)) s"
echo "all tests passed (normal build and ASan+UBSan build, fuzz=$fuzz)"
