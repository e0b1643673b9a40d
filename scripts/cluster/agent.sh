#!/bin/sh
# Open MPI's ssh launcher agent (plm_rsh_agent) for the emulated hosts of
# cluster.sh: called as `agent.sh ADDRESS COMMAND...`, as ssh would be, it
# runs COMMAND (Open MPI's daemon) in the namespace of the host with that
# address, under a UTS namespace of its own named after the host, so that
# the daemon and the ranks it starts see that host name
# (MPI_Get_processor_name). COMMAND comes quoted for a remote shell, as ssh
# passes it: sh parses it here.
host=$1
shift
prefix=${RMOE_CLUSTER_PREFIX:-rmoeh}
# The hostfile names each host by its management address, 192.168.78.(10 + i).
case $host in
  192.168.78.*) i=$(( ${host##*.} - 10 )) ;;
  *) echo "agent.sh: $host is not an emulated host's management address (192.168.78.10 and up)" >&2; exit 1 ;;
esac
ns=$prefix$i
[ "$i" -ge 0 ] && [ -e "/var/run/netns/$ns" ] || { echo "agent.sh: no emulated host at $host ($ns)" >&2; exit 1; }
exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && exec $*"
