"""A torch.distributed.TCPStore client exercising every method its torch has
against ddprun's torch store (launcher/store/torch_store.h).

    python torch_store_client.py PORT store   # the c10d store API, one process
    python torch_store_client.py PORT group   # a gloo group of 2 through env:// and
                                              # TORCHELASTIC_USE_AGENT_STORE=True

Prints "TORCH STORE OK <what>" when every check passed; an assertion names
the one that did not.
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

PORT = int(sys.argv[1])
WHAT = sys.argv[2]
TIMEOUT = datetime.timedelta(seconds=20)


def client():
    return dist.TCPStore("127.0.0.1", PORT, is_master=False, timeout=TIMEOUT)


def later(seconds, action):
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    thread.start()
    return thread


def expect_timeout(action):
    try:
        action()
    except Exception as e:  # RuntimeError (1.13), DistStoreError (2.x)
        return str(e)
    raise AssertionError("no timeout")


def store_api():
    s = client()
    s.set("k", "v")
    assert s.get("k") == b"v"
    s.set("k", b"\x00binary\xff")
    assert s.get("k") == b"\x00binary\xff"
    s.set("empty", "")
    assert s.get("empty") == b""
    assert s.add("n", 5) == 5 and s.add("n", -2) == 3 and s.get("n") == b"3"
    # compare_set: swapped, not swapped, missing key (torch answers the expected value)
    assert s.compare_set("k", b"\x00binary\xff", "w") == b"w"
    assert s.compare_set("k", "nope", "x") == b"w"
    assert s.compare_set("missing-cs", "exp", "x") == b"exp"
    assert s.compare_set("new-cs", "", "fresh") == b"fresh"
    s.wait(["k", "n"])
    s.wait(["k"], datetime.timedelta(seconds=1))
    keys_before = s.num_keys()
    assert s.delete_key("k") is True and s.delete_key("k") is False
    assert s.num_keys() == keys_before - 1
    # A WAIT that another client's SET releases; a GET that waits for its key.
    other = client()
    setter = later(0.3, lambda: other.set("late", "here"))
    s.wait(["late"])
    setter.join()
    setter = later(0.3, lambda: other.set("late2", "there"))
    assert s.get("late2") == b"there"
    setter.join()
    # A WAIT that times out (torch 2.x then sends CANCEL_WAIT); the client goes on.
    message = expect_timeout(lambda: s.wait(["never"], datetime.timedelta(milliseconds=300)))
    assert s.add("after-timeout", 1) == 1, message
    if hasattr(s, "check"):
        assert s.check(["n"]) is True and s.check(["n", "never"]) is False
    if hasattr(s, "append"):
        s.append("log", "a")
        s.append("log", "bc")
        assert s.get("log") == b"abc"
    if hasattr(s, "multi_get"):
        s.multi_set(["m1", "m2"], ["one", b"two"])
        assert s.multi_get(["m1", "m2", "n"]) == [b"one", b"two", b"3"]
    if hasattr(s, "queue_push"):
        s.queue_push("q", "a")
        s.queue_push("q", "b")
        assert s.queue_len("q") == 2
        assert s.queue_pop("q") == b"a" and s.queue_pop("q", False) == b"b"
        try:
            s.queue_pop("q", False)
            raise AssertionError("popped an empty queue")
        except dist.QueueEmptyError:
            pass
        pusher = later(0.3, lambda: other.queue_push("q2", "pushed"))
        assert s.queue_pop("q2") == b"pushed"  # WAIT for the queue, then pop
        pusher.join()
    if hasattr(s, "list_keys"):
        keys = s.list_keys()
        assert "n" in keys and "m1" in keys and "k" not in keys, keys
    if hasattr(s, "barrier"):
        s.barrier("b1", 1)
        arrival = later(0.3, lambda: other.barrier("b2", 2))
        s.barrier("b2", 2)
        arrival.join()
        expect_timeout(lambda: s.barrier("b3", 2, datetime.timedelta(milliseconds=300)))
        assert s.get("n") == b"3"  # the connection survived the cancelled barrier
    if hasattr(s, "clone"):
        assert s.clone().get("n") == b"3"
    print("TORCH STORE OK store", torch.__version__, flush=True)


def group():
    """What init_process_group("gloo"), DDP and barrier() send, from 2 ranks."""
    import torch.multiprocessing as mp

    mp.spawn(rank_main, nprocs=2, join=True)
    print("TORCH STORE OK group", torch.__version__, flush=True)


def rank_main(rank):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
        TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0", GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0, t
    dist.barrier()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.full((2, 4), float(rank))).sum().backward()
    grads = [torch.zeros(4) for _ in range(2)]
    dist.all_gather(grads, model.module.weight.grad.view(-1))
    assert torch.equal(grads[0], grads[1]), grads
    dist.barrier()
    del model  # before its group: torch 1.13's DDP can hang in its destructor after destroy_process_group
    dist.destroy_process_group()
    # Without the interpreter's teardown: a Gloo thread still releasing a
    # tensor then aborts the process (torch 2.x, now and then).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    {"store": store_api, "group": group}[WHAT]()
