#!/bin/sh
# One rank of test_cut_link.sh, started by mpirun as `setsid -w rank.sh DIR
# PROGRAM ARGS...`: runs PROGRAM with its output in DIR/rankR.log and writes
# its pid to DIR/rankR.pid, its host to DIR/rankR.host and its exit status
# to DIR/rankR.status (R: the MPI rank). In a session of its own (setsid), so that when mpirun ends the
# job after the first rank ends, the others still end by themselves and
# the test sees what each one did.
dir=$1
shift
r=$OMPI_COMM_WORLD_RANK
hostname >"$dir/rank$r.host"
"$@" >"$dir/rank$r.log" 2>&1 &
echo $! >"$dir/rank$r.pid"
wait $!
echo $? >"$dir/rank$r.status"
