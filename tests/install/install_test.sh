#!/usr/bin/env bash
# Usage: install_test.sh BUILD_DIR SRC_DIR TORCH_PREFIX MPIRUN — installs accel into a temporary
# prefix, builds tests/install/consumer against it with find_package(accel), runs it on 2 ranks.
set -euo pipefail
build=$1 src=$2 torch_prefix=$3 mpirun=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
cmake -S "$src/tests/install/consumer" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix;$torch_prefix" > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$mpirun" --oversubscribe -np 2 "$tmp/build/consumer"
"$tmp/prefix/bin/accel" env | head -3
