#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair, for the multi-node tests.
#
#   multinode_netns.sh COMMAND [ARGS...]
#
# Makes the namespaces accel_mn_<pid>_0 and accel_mn_<pid>_1 (<pid> is this script's, so runs side by
# side do not clash), each with `lo` up and one end of a veth pair named accelmn (10.213.7.1/24 in
# namespace 0, 10.213.7.2/24 in namespace 1; the pair lives only inside the two namespaces, so the
# fixed subnet and name clash with nothing), then runs COMMAND in the current namespace with
#   ACCEL_MN_NS0, ACCEL_MN_NS1     the namespace names        (`ip netns exec "$ACCEL_MN_NS0" ...`)
#   ACCEL_MN_IP0, ACCEL_MN_IP1     their addresses            (host names for a hostfile)
#   ACCEL_MN_SUBNET, ACCEL_MN_IF   10.213.7.0/24, accelmn     (for btl/oob_tcp_if_include)
#   ACCEL_MN_HOSTMAP               "IP0=NS0 IP1=NS1"          (read by multinode_rsh_agent.sh)
# and exits with COMMAND's status. Run things on a host with multinode_enter.sh NS COMMAND (which
# also gives the host a hostname of its own; Open MPI needs that, see there). The namespaces (and the veth pair with them) are removed on every
# way out: normal exit, error, Ctrl-C, SIGTERM. Namespaces left by an earlier run that was killed
# outright (SIGKILL, e.g. a ctest timeout) are removed at the next start once their <pid> is gone.
#
# Where namespaces cannot be made (not root / no CAP_SYS_ADMIN, no iproute2, no veth support, no
# UTS namespaces for the hostnames), prints
# "SKIP: cannot create network namespaces: <reason>" and exits 77 (ctest SKIP_RETURN_CODE).
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 COMMAND [ARGS...]" >&2
  exit 2
fi

skip() {
  echo "SKIP: cannot create network namespaces: $*"
  exit 77
}

command -v ip > /dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed"

PREFIX=accel_mn_
NS0=${PREFIX}$$_0
NS1=${PREFIX}$$_1
IP0=10.213.7.1
IP1=10.213.7.2
IF=accelmn

# Stale namespaces of runs that were killed before their trap could run.
for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9]*_[01]$"); do
  pid=${ns#"$PREFIX"}
  pid=${pid%_*}
  if [ "$pid" != "$$" ] && ! kill -0 "$pid" 2> /dev/null; then
    echo "multinode_netns: removing stale namespace $ns (its run, pid $pid, is gone)"
    ip netns pids "$ns" 2> /dev/null | xargs -r kill -KILL 2> /dev/null
    ip netns del "$ns" 2> /dev/null
  fi
done

made=()
teardown() {
  local ns pids
  for ns in "${made[@]}"; do
    # Whatever COMMAND left running inside (ranks, orted) goes with its namespace.
    pids=$(ip netns pids "$ns" 2> /dev/null)
    if [ -n "$pids" ]; then
      kill -TERM $pids 2> /dev/null
      sleep 1
      pids=$(ip netns pids "$ns" 2> /dev/null)
      [ -z "$pids" ] || kill -KILL $pids 2> /dev/null
    fi
    ip netns del "$ns" 2> /dev/null || echo "multinode_netns: warning: could not remove namespace $ns" >&2
  done
  made=()
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

for ns in "$NS0" "$NS1"; do
  if ! err=$(ip netns add "$ns" 2>&1); then
    skip "'ip netns add $ns' failed: ${err:-no message} (needs root or CAP_SYS_ADMIN)"
  fi
  made+=("$ns")
done
if ! err=$(ip -n "$NS0" link add "$IF" type veth peer name "$IF" netns "$NS1" 2>&1); then
  skip "'ip link add ... type veth' failed: ${err:-no message}"
fi
if ! err=$(ip netns exec "$NS0" unshare --uts true 2>&1); then
  skip "'unshare --uts' (a hostname per host) failed: ${err:-no message}"
fi
set -e
ip -n "$NS0" addr add "$IP0/24" dev "$IF"
ip -n "$NS1" addr add "$IP1/24" dev "$IF"
for ns in "$NS0" "$NS1"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$IF" up
done
# Both ends report "up" (a veth's carrier comes once both are up) before anything uses the link.
for _ in $(seq 100); do
  [ "$(ip netns exec "$NS0" cat /sys/class/net/$IF/operstate)" = up ] &&
    [ "$(ip netns exec "$NS1" cat /sys/class/net/$IF/operstate)" = up ] && break
  sleep 0.1
done
set +e
echo "multinode_netns: host $IP0 = namespace $NS0, host $IP1 = namespace $NS1 (veth $IF)"

export ACCEL_MN_NS0=$NS0 ACCEL_MN_NS1=$NS1 ACCEL_MN_IP0=$IP0 ACCEL_MN_IP1=$IP1
export ACCEL_MN_SUBNET=10.213.7.0/24 ACCEL_MN_IF=$IF ACCEL_MN_HOSTMAP="$IP0=$NS0 $IP1=$NS1"
# Not exec: the trap must outlive COMMAND. Run it in the background and wait, so that a signal to
# this script is handled at once (the trap then tears down) rather than after COMMAND ends.
"$@" &
child=$!
trap 'kill -TERM $child 2> /dev/null; exit 130' INT
trap 'kill -TERM $child 2> /dev/null; exit 143' TERM
wait $child
status=$?
exit $status
