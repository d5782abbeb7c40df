# A torch 2.x program whose entry point is wrapped in torch's @record, as
# torchrun's docs recommend: the failing rank's exception goes to its
# TORCHELASTIC_ERROR_FILE (error.json), which the launcher passes on.
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if rank == int(os.environ.get("FAIL_RANK", "1")):
        raise ValueError(f"deliberate failure on rank {rank}")
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
