#!/bin/bash
# Run: bash mpi_allreduce.sh [trials]  -- builds mpi_allreduce.c (mpicc -O2) into $PEERS_OUT (see common.sh) and runs N=2,4 (default MCA, and N=4 with mpi_yield_when_idle=1).
set -e
cd "$(dirname "$0")"; source ./common.sh
T=${1:-5}
mpicc -O2 -o $S/mpi_allreduce mpi_allreduce.c
$MPIRUN -np 2 $S/mpi_allreduce "" $T
$MPIRUN -np 4 $S/mpi_allreduce "" $T
$MPIRUN -np 4 --mca mpi_yield_when_idle 1 $S/mpi_allreduce "_yield" $T
