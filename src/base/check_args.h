// accel::check_args — a dry run of a script's commands, for a script that will run where time is
// short (a lent GPU: scripts/gpu_check.sh, gpu_lease.sh). With ACCEL_CHECK_ARGS=DIR set, each program
// that takes part writes DIR/<pid>.start with its command line as it starts, and DIR/<pid>.ok once it
// has checked its arguments, and then stops (exit 0) before it touches a device, a peer or the data
// (`accel` instead runs its command, whose launches run such programs, and passes when it returns 0).
// A command whose arguments would fail therefore leaves a .start without a .ok, whatever the way it
// failed (tests/scripts/gpu_args.sh runs the GPU scripts so on this machine and lists those).
// Taking part: step_bench and the GPT example (after their options parse), the test binaries (their
// --gtest_filter must match a test), `accel` (its command line parses and the command returns 0) and
// benchmarks/torch_anchor.py (after argparse).
#pragma once

namespace accel::check_args {

// Whether ACCEL_CHECK_ARGS names a directory to write to.
bool active();
// Writes DIR/<pid>.start with argv (one argument a line). No-op when not active.
void started(int argc, char** argv);
// Writes DIR/<pid>.ok. No-op when not active.
void passed();
// When active: passed(), a line on stderr saying so ("<program>: arguments checked (ACCEL_CHECK_ARGS)"),
// and exit 0. Returns when not active.
void stop_here(const char* program);

}  // namespace accel::check_args
