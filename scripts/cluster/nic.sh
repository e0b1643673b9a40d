#!/bin/sh
# Put before the program on mpirun's command line inside scripts/cluster/
# cluster.sh run: binds this rank's MPI messages between hosts to adapter
# (local rank mod RMOE_CLUSTER_NICS) of its host (eth0, fab1, ...), as each
# GPU of a MareNostrum 5 node has its own, then runs the program. With one
# adapter a host it only runs the program.
#   "$RMOE_CLUSTER_MPIRUN" ... "$RMOE_CLUSTER_NIC" PROGRAM ARGS...
nics=${RMOE_CLUSTER_NICS:-1}
if [ "$nics" -gt 1 ]; then
  j=$(( ${OMPI_COMM_WORLD_LOCAL_RANK:?nic.sh: not started by mpirun} % nics ))
  if [ "$j" -eq 0 ]; then dev=eth0; else dev=fab$j; fi
  export OMPI_MCA_btl_tcp_if_include=$dev
fi
exec "$@"
