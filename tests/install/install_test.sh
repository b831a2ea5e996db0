#!/usr/bin/env bash
# Usage: install_test.sh BUILD_DIR SRC_DIR TORCH_PREFIX MPIRUN — installs accel into a temporary
# prefix, checks the installed headers (each one's own includes are installed; internal ones are
# not), builds tests/install/consumer against it with find_package(accel), runs it on 2 ranks and
# runs the installed `accel env`. Exits non-zero at the first failure (ctest also checks the output:
# tests/CMakeLists.txt).
set -euo pipefail
build=$1 src=$2 torch_prefix=$3 mpirun=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null

inc=$tmp/prefix/include/accel
bad=0
while IFS= read -r h; do
  while IFS= read -r name; do
    name=${name#accel/}
    [ -f "$(dirname "$h")/$name" ] || [ -f "$inc/$name" ] ||
      { echo "installed header ${h#"$inc"/} includes \"$name\", which is not installed"; bad=1; }
  done < <(sed -n -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' \
                  -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(accel\/[^>]*\)>.*/\1/p' "$h")
done < <(find "$inc" -name '*.h')
for internal in accelerator/config_detail.h comm/transport/backend.h cli/commands.h; do
  [ ! -e "$inc/$internal" ] || { echo "internal header $internal is installed"; bad=1; }
done
[ $bad -eq 0 ] || exit 1
echo "installed headers: $(find "$inc" -name '*.h' | wc -l), their includes all installed, internal ones absent"

cmake -S "$src/tests/install/consumer" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix;$torch_prefix" > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$mpirun" --oversubscribe -np 2 "$tmp/build/consumer"
env_out=$("$tmp/prefix/bin/accel" env)
printf '%s\n' "$env_out" | head -3
