#!/usr/bin/env bash
# Open MPI's "ssh" for hosts that are network namespaces on this machine (multinode_netns.sh).
#
#   OMPI_MCA_plm_rsh_agent=/path/multinode_rsh_agent.sh mpirun --host 10.213.7.2:2 ...
#
# Open MPI 4.1's rsh launcher runs `AGENT [plm_rsh_args...] HOST WORD...`, where the WORDs are the
# remote command (`orted -mca ess "env" ...`, with shell quoting inside the words, as ssh would hand
# them to the remote login shell). This agent finds HOST in ACCEL_MN_HOSTMAP ("IP=NAMESPACE ..."),
# treats any words before it as agent options (ignored: there is no ssh), and runs the joined WORDs
# with `sh -c` on that host (multinode_enter.sh: its network namespace, its own hostname). Unlike
# ssh, the caller's environment goes along unchanged.
set -u
if [ -z "${ACCEL_MN_HOSTMAP:-}" ]; then
  echo "multinode_rsh_agent: ACCEL_MN_HOSTMAP is not set (run under multinode_netns.sh)" >&2
  exit 255
fi
ns=""
while [ $# -gt 0 ]; do
  for kv in $ACCEL_MN_HOSTMAP; do
    if [ "${kv%%=*}" = "$1" ]; then
      ns=${kv#*=}
      break
    fi
  done
  shift
  [ -z "$ns" ] || break
done
if [ -z "$ns" ]; then
  echo "multinode_rsh_agent: no host of ACCEL_MN_HOSTMAP ($ACCEL_MN_HOSTMAP) among the arguments" >&2
  exit 255
fi
if [ $# -eq 0 ]; then
  echo "multinode_rsh_agent: no command for namespace $ns" >&2
  exit 255
fi
exec "$(dirname "$0")/multinode_enter.sh" "$ns" sh -c "$*"
