#!/usr/bin/env bash
# A stand-in for accel's programs in tests/scripts/gpu_scripts.sh: prints its name and arguments, then
# sleeps FAKE_SLEEP seconds (FAKE_SLEEP_<name> for the program <name>, - read as _) in itself and in a
# child process (both must go when a step is stopped; both show this script's path in their command
# lines).
name=$(basename "$0")
var=FAKE_SLEEP_${name//-/_}
secs=${!var:-${FAKE_SLEEP:-0}}
echo "$name $* starting"
(sleep "$secs") &
sleep "$secs"
wait
echo "$name done"
