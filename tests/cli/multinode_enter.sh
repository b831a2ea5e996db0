#!/usr/bin/env bash
# Runs a command on one of multinode_netns.sh's hosts: inside the network namespace NS, with a UTS
# namespace of its own whose hostname is NS with '_' -> '-' (accel_mn_123_1 -> accel-mn-123-1).
#
#   multinode_enter.sh NS COMMAND [ARGS...]
#
# The hostname matters: the two hosts share this machine's /tmp and /dev/shm, and Open MPI names
# per-host files after the hostname (the session directory /tmp/ompi.<hostname>.<uid>/jf.<job family>
# with PMIx's shared-memory store, vader's segments vader_segment.<hostname>.<jobid>.<local rank>).
# Two "hosts" with this machine's one hostname share those files, and ranks die with SIGSEGV in
# ob1/vader (seen with Open MPI 4.1.4, with and without vader). The caller's environment goes along.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 NAMESPACE COMMAND [ARGS...]" >&2
  exit 2
fi
ns=$1
shift
exec ip netns exec "$ns" unshare --uts sh -c 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"' \
  "$(printf '%s' "$ns" | tr _ -)" "$@"
