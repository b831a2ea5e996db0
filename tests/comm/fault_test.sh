#!/usr/bin/env bash
# Usage: fault_test.sh ACCEL_CLI PROBE MODE NP — runs the fault probe (tests/comm/fault_probe.cpp) under
# `accel launch` (mpirun underneath; MPIRUN OPTIONS go through --launcher_args) and asserts what the
# ranks that are left do and say, and that the job ends within a bound (the probe's timeout plus
# start-up slack), never hangs:
#   timeout  rank 1 never joins: rank 0 raises TimeoutError naming the collective, itself and rank 1
#            (running, but behind: it has not joined); the job
#            ends non-zero.
#   exit     rank 1 exits with code 7 before the collective. Twice:
#            - as mpirun runs by default: the job ends with rank 1's code 7, mpirun naming rank 1 as
#              the first process to fail (exit status 7 is rank 1's, not one mpirun makes up);
#            - with mpirun told to leave the others running (orte_abort_on_non_zero_status 0, as a
#              launcher that does not kill the job would): the survivors end it themselves. Their
#              all_reduce raises TimeoutError after its 3 s, naming the collective, the rank and rank 1
#              as gone; the broken communicator aborts the job (MPI_Abort). accel launch exits
#              with the first failing rank's status, rank 1's 7, and names it (mpirun alone would
#              exit with MPI_Abort's 1).
#   step     rank 1's optimizer step throws while its peers are inside the step's collectives, and
#            its main returns: the job ends within the bound (not after the peers' 60 s timeout),
#            non-zero, with rank 1 and the error named.
#   In every run no rank's collective completes without rank 1.
set -u
accel=$1 probe=$2 mode=$3 np=$4
limit=40
fail=0
check() { "$@" || { echo "FAIL: $desc"; fail=1; }; }
has() { grep -Eq -- "$1" <<< "$out"; }
lacks() { ! has "$1"; }

run() {  # run LABEL [MPIRUN OPTIONS...]: sets out, rc, elapsed
  local label=$1
  shift
  local start extra=()
  [ $# -gt 0 ] && extra=(--launcher_args "$*")
  start=$(date +%s)
  out=$(timeout 120 "$accel" launch -n "$np" "${extra[@]}" "$probe" "$mode" 2>&1)
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  echo "---- $label"
  echo "$out" | grep -v '^\[vm' | tail -n 20
  echo "fault_test: mode=$mode np=$np ($label): exit=$rc elapsed=${elapsed}s (bound ${limit}s)"
  desc="the job hung (killed by timeout 120)"; check [ "$rc" -ne 124 ]
  desc="took ${elapsed}s > ${limit}s"; check [ "$elapsed" -le "$limit" ]
  desc="a collective completed without rank 1"; check lacks "returned without rank 1"
}

case $mode in
  timeout)
    run "rank 1 never joins"
    desc="the job exited 0 although a rank failed"; check [ "$rc" -ne 0 ]
    desc="no TimeoutError naming the collective and rank 0"
    check has "caught TimeoutError: all_reduce\(float32\[4\], sum\) on rank 0 of $np did not complete within 2"
    desc="the TimeoutError does not name rank 1 (running, but not in the collective)"
    check has "on rank 0 of $np did not complete within 2 s: rank 1 \(pid [0-9]+\) has not joined it"
    ;;
  exit)
    run "rank 1 exits 7, mpirun's default"
    desc="exit status $rc, not rank 1's 7"; check [ "$rc" -eq 7 ]
    desc="mpirun does not name rank 1 (exit code 7) as the first process to fail"
    check has "Process name: +\[\[[0-9]+,[0-9]+\],1\]"
    check has "Exit code: +7"

    run "rank 1 exits 7, the others left running" --mca orte_abort_on_non_zero_status 0
    desc="exit status $rc, not rank 1's 7 (the first failure, as accel launch reports it)"; check [ "$rc" -eq 7 ]
    desc="accel launch does not name rank 1 as the first to fail"; check has "accel launch: rank 1 .* failed first: it exited with code 7"
    # Each survivor that reports (MPI_Abort of the first may end the other before it prints) names
    # the collective, itself and the cause; at least one reports.
    reports=$(grep -E "^rank [0-9]+ caught TimeoutError" <<< "$out" || true)
    desc="no surviving rank reported a TimeoutError"; check [ -n "$reports" ]
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      r=$(sed -E 's/^rank ([0-9]+) .*/\1/' <<< "$line")
      desc="a report from rank $r, which died"; check [ "$r" != 1 ]
      desc="rank $r's report does not name the collective, the rank and rank 1 as gone: $line"
      check grep -Eq "caught TimeoutError: all_reduce\(float32\[4\], sum\) on rank $r of $np did not complete within 3 s: rank 1 \(pid [0-9]+, gone\) has not joined it" <<< "$line"
    done <<< "$reports"
    desc="no rank aborted the job for its broken communicator"
    check has "accel: rank (0|2) aborting the MPI job: a collective did not complete"
    ;;
  step)
    limit=20
    export ACCEL_COMM_TIMEOUT_S=60  # what the job must not wait for
    run "rank 1's optimizer step throws"
    desc="the job exited 0 although rank 1's step failed"; check [ "$rc" -ne 0 ]
    desc="rank 1 does not report its error"; check has "rank 1 caught: injected failure in rank 1's closure"
    desc="the log does not name the failed step, rank 1 and the error"
    check has "the optimizer step failed on rank 1: injected failure in rank 1's closure"
    desc="a peer finished the step without rank 1"; check lacks "rank [02]: the step returned"
    ;;
  *) echo "fault_test.sh: unknown mode '$mode' (timeout, exit or step)"; exit 2 ;;
esac
[ $fail -eq 0 ] && echo "fault_test: PASS"
exit $fail
