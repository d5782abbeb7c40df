// train: the reference data-parallel trainer (trainer.cc).
//
//   ddprun --nproc_per_node=4 build/examples/train --steps 300 --lr 0.05
//   ddprun --nproc_per_node=2 build/examples/train --data digits --epochs 20
//
// See docs/train.md for the flags, the data, the engines and the output.

#include "trainer.h"

int main(int argc, char** argv) { return train::run_trainer({argv, argv + argc}); }
