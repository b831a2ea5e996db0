#!/usr/bin/env bash
# libFuzzer on the safetensors header parser. Usage: run_fuzz.sh [SECONDS=300] [WORKDIR=/tmp/accel_fuzz_safetensors]
# Compiles src/checkpoint/safetensors_header.cpp (the parser, no torch) + the harness with
# clang++ -fsanitize=fuzzer,address,undefined, seeds a corpus with valid files, and runs for SECONDS.
# Exits 77 (ctest: skipped) when no clang++ with libFuzzer is available; otherwise the fuzzer's status.
set -euo pipefail
SECONDS_TO_RUN=${1:-300}
WORK=${2:-/tmp/accel_fuzz_safetensors}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../src" && pwd)
CXX=${CXX:-clang++}
case "$(basename "$CXX")" in clang++*) ;; *) CXX=clang++ ;; esac
mkdir -p "$WORK/seeds" "$WORK/corpus"
if ! command -v "$CXX" >/dev/null 2>&1 ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     "$CXX" -x c++ -fsanitize=fuzzer,address,undefined - -o "$WORK/probe" >/dev/null 2>&1; then
  echo "SKIPPED: no clang++ with -fsanitize=fuzzer (apt-get install clang)"; exit 77
fi
"$CXX" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DFMT_HEADER_ONLY=1 \
  -I"$SRC" "$SRC/checkpoint/safetensors_header.cpp" "$HERE/fuzz_safetensors_header.cpp" -o "$WORK/fuzz_safetensors_header"

# Seeds: valid files (8-byte little-endian length, space-padded JSON, data).
seed() {  # seed NAME JSON DATA_BYTES
  local json=$2 n i
  while (( ${#json} % 8 )); do json+=" "; done
  n=${#json}
  {
    for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(( (n >> (8 * i)) & 255 )))"; done
    printf '%s' "$json"
    head -c "$3" /dev/zero
  } > "$WORK/seeds/$1"
}
seed empty '{}' 0
seed meta '{"__metadata__":{"format":"pt"}}' 0
seed one '{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}' 24
seed many '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},"b":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"c":{"dtype":"F64","shape":[2],"data_offsets":[8,24]},"e":{"dtype":"BOOL","shape":[0],"data_offsets":[30,30]},"f":{"dtype":"F8_E4M3","shape":[2,1],"data_offsets":[30,32]}}' 32
cat > "$WORK/dict" <<'DICT'
"{"
"}"
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"BF16\""
"\"I64\""
"\"BOOL\""
"\"F8_E5M2\""
"18446744073709551615"
"9223372036854775807"
"4294967296"
"-1"
"1e309"
"[0,0]"
"\"\\u0000\""
DICT
echo "fuzzing for ${SECONDS_TO_RUN}s in $WORK"
cd "$WORK"
exec ./fuzz_safetensors_header -max_total_time="$SECONDS_TO_RUN" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 -dict="$WORK/dict" "$WORK/corpus" "$WORK/seeds"
