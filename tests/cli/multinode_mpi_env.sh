# Sourced by the multi-node tests that run under multinode_netns.sh (which exports ACCEL_MN_*):
#   mn_hostfile PATH   writes a hostfile of the two hosts, 2 slots each
#   mn_mpi_env         the environment Open MPI needs there, for `env "${mn_mpi_env[@]}" ...`:
#     OMPI_MCA_plm_rsh_agent      "ssh" = enter the host's namespace (multinode_rsh_agent.sh)
#     OMPI_MCA_*_tcp_if_include   runtime and MPI traffic on the veth only (the namespaces have only it
#                                 and lo; explicit anyway)
#     OMPI_MCA_pml=ob1, btl       no UCX/OFI/openib probing: shared memory within a host, TCP between
: "${ACCEL_MN_NS0:?run under multinode_netns.sh}"
mn_hostfile() { printf '%s slots=2\n%s slots=2\n' "$ACCEL_MN_IP0" "$ACCEL_MN_IP1" > "$1"; }
mn_mpi_env=(
  OMPI_MCA_plm_rsh_agent="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/multinode_rsh_agent.sh"
  OMPI_MCA_oob_tcp_if_include="$ACCEL_MN_SUBNET"
  OMPI_MCA_btl_tcp_if_include="$ACCEL_MN_SUBNET"
  OMPI_MCA_pml=ob1
  OMPI_MCA_btl=self,vader,tcp
)
