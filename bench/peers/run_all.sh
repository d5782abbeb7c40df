#!/bin/bash
# Run: bash run_all.sh  -- runs every baseline in sequence (~15 min on 2 cores); outputs to $PEERS_OUT/*.out (see common.sh) and stdout.
cd "$(dirname "$0")"; source ./common.sh
bash launch_overhead.sh 10      | tee $S/launch.out
/usr/bin/python3 rdzv_init.py 5 | tee $S/rdzv.out
/usr/bin/python3 barrier.py 5   | tee $S/barrier.out
/usr/bin/python3 allreduce_gloo.py 5 | tee $S/allreduce_gloo.out
bash mpi_allreduce.sh 5         | tee $S/mpi.out
bash membw.sh                   | tee $S/membw.out
/usr/bin/python3 ddp_step.py 3  | tee $S/ddp.out
