"""Baseline: PyTorch DistributedDataParallel (backend "gloo", CPU) training a small CNN on
Fashion-MNIST, --world processes on this machine, rendezvous on 127.0.0.1 (a free port).

Run it with Debian's interpreter (python3-torch 1.13 on OpenBLAS, see
/work/shared/BENCHMARKING.md):

    /usr/bin/python3 bench/cnn_ddp_torch.py --max_steps 200     # quick check
    /usr/bin/python3 bench/cnn_ddp_torch.py --epochs 1
    /usr/bin/python3 bench/cnn_ddp_torch.py --epochs 5 --eval_each_epoch
        # seed 1: test accuracy 0.870, 0.890, 0.901, 0.907, 0.912 after epochs 1-5

What it measures: data-parallel training throughput of examples/fashion_mnist.make_cnn()
(Conv 1->32, Conv 32->64, Linear 3136->128->10; ~420k parameters), the number to compare
with the cluster's allreduce placement training the same CNN:
  - every rank holds the whole model; each step it takes its own batch of --batch_size
    (default 64) examples, forward, mean softmax cross-entropy, backward with DDP's gradient
    all-reduce (the mean over ranks), then Adam (lr 1e-3, PyTorch's default betas/eps).
  - initial parameters: PyTorch's default init after torch.manual_seed(seed), the same seed
    on every rank (DDP also broadcasts rank 0's parameters at construction).
  - data: fashion_mnist.load (pixels/255, mean 0.2860 / std 0.3530, float32) and
    fashion_mnist.batches: one permutation per epoch from numpy's default_rng(seed*1000 +
    epoch), rank r's batch p = entries [(p*world + r)*B, (p*world + r + 1)*B): disjoint
    shards, steps per epoch = 60000 // (world*B).
  - one compute thread per process (torch.set_num_threads(1), OMP/OPENBLAS/MKL_NUM_THREADS=1
    set before torch is imported): on 2 cores, 2 processes x 1 thread.

Timing (like the workers' FinishSummary and bench/ddp_torch.py): each rank's clock starts
just before its first step (no warm-up steps excluded) and stops after its last; start-up
(imports, data loading, process group, DDP) and the final test evaluation are excluded and
reported separately (so are the per-epoch evaluations of --eval_each_epoch, on every rank). Every step includes taking the batch from the in-memory dataset.
    samples_per_sec = sum over ranks of steps * batch_size / train_seconds_r
"train_seconds" is the slowest rank's. Progress lines (rank 0, every --progress_every
steps) show the loss averaged since the last line, the rate summed over ranks as rank 0
sees it (its own rate x world) and the ETA; "final_loss" in the JSON is rank 0's mean loss
over the last of those intervals.

The last line on stdout is one JSON object:
    {"framework": "torch-ddp-gloo", "model": "cnn", "world": N, "batch_size": B,
     "steps": S, "epochs": E, "train_seconds": T, "samples_per_sec": X,
     "test_accuracy": A, ...a few more fields (per-rank figures, start-up, loss)}
"""
import argparse
import gc
import json
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

FRAMEWORK = "torch-ddp-gloo"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="processes (ranks)")
    p.add_argument("--batch_size", type=int, default=64, help="examples per step per rank")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0, help="cap on training steps (0: none)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1, help="initial parameters and data order")
    p.add_argument("--progress_every", type=int, default=100, help="steps between progress lines")
    p.add_argument("--eval_each_epoch", action="store_true",
                   help="rank 0 also prints the test accuracy after every epoch (excluded from "
                        "every rank's clock)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds before the launcher gives up and kills the ranks")
    a = p.parse_args(argv)
    if a.world < 1 or a.batch_size < 1 or a.epochs < 1 or a.max_steps < 0:
        p.error("--world, --batch_size and --epochs must be >= 1, --max_steps >= 0")
    return a


def run(rank, a, port, t_launch):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import fashion_mnist as fm

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    world, B = a.world, a.batch_size
    x_train, y_train = fm.load("train")
    x_test, y_test = fm.load("test")
    per_epoch = len(x_train) // (world * B)
    if per_epoch < 1:
        raise SystemExit("the data is smaller than one global batch")
    total = per_epoch * a.epochs if a.max_steps == 0 else min(a.max_steps, per_epoch * a.epochs)
    epochs_run = (total + per_epoch - 1) // per_epoch
    order = [fm.batches(len(x_train), B, rank, world, e, a.seed) for e in range(epochs_run)]
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)

    torch.manual_seed(a.seed)  # identical initial parameters on every rank
    model = fm.make_cnn()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr)

    dist.barrier()  # every rank ready: start-up ends here
    startup = time.perf_counter() - t_launch
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{FRAMEWORK}: cnn ({n_params} parameters), world {world}, batch {B}/rank, "
              f"{total} steps ({per_epoch}/epoch), 1 thread/rank, torch {torch.__version__}; "
              f"start-up {startup:.1f} s", flush=True)
    train_seconds, paused, final_loss = train(a, rank, ddp, model, opt, order, (xt, yt),
                                              (x_test, y_test), per_epoch, total)

    acc, eval_seconds = -1.0, 0.0
    if rank == 0:
        t0 = time.perf_counter()
        acc = fm.accuracy(model, x_test, y_test)
        eval_seconds = time.perf_counter() - t0
    gathered = [None] * world
    dist.all_gather_object(gathered, {"train_seconds": train_seconds})
    # Teardown order from bench/ddp_torch.py (a torch 1.13 hang otherwise): a barrier, free
    # DDP while the default group still holds the process group, then destroy the group.
    dist.barrier()
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()
    if rank != 0:
        return
    report(a, total, epochs_run, gathered, acc, startup, eval_seconds + paused, final_loss)


def train(a, rank, ddp, model, opt, order, train_set, test_set, per_epoch, total):
    """The timed steps; returns (training seconds, seconds of --eval_each_epoch evaluations,
    rank 0's mean loss over the last progress interval)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import fashion_mnist as fm

    world, B, epochs_run = a.world, a.batch_size, len(order)
    xt, yt = train_set
    loss_sum, loss_n, final_loss = 0.0, 0, float("nan")
    paused = 0.0  # seconds of --eval_each_epoch evaluations, taken off every rank's clock
    start = time.perf_counter()
    for step in range(total):
        e, p = divmod(step, per_epoch)
        idx = torch.from_numpy(order[e][p])
        x, y = xt.index_select(0, idx), yt.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        loss_sum += loss.item()
        loss_n += 1
        if rank == 0 and ((step + 1) % a.progress_every == 0 or step + 1 == total):
            elapsed = time.perf_counter() - start - paused
            eta = elapsed / (step + 1) * (total - step - 1)
            print(f"rank 0: epoch {e + 1}/{epochs_run} step {step + 1}/{total} "
                  f"loss {loss_sum / loss_n:.4f} {(step + 1) * B * world / elapsed:.0f} samples/s "
                  f"(all ranks) ETA {eta:.0f} s", flush=True)
            final_loss, loss_sum, loss_n = loss_sum / loss_n, 0.0, 0
        if a.eval_each_epoch and (step + 1) % per_epoch == 0 and step + 1 < total:
            t0 = time.perf_counter()
            if rank == 0:
                print(f"rank 0: epoch {e + 1} test accuracy "
                      f"{fm.accuracy(model, *test_set):.4f}", flush=True)
            dist.barrier()  # the other ranks wait here, off the clock too
            paused += time.perf_counter() - t0
    return time.perf_counter() - start - paused, paused, final_loss


def report(a, total, epochs_run, gathered, acc, startup, eval_seconds, final_loss):
    """Rank 0's JSON line of the run."""
    import torch
    per_rank = [total * a.batch_size / g["train_seconds"] for g in gathered]
    result = {
        "framework": FRAMEWORK, "model": "cnn", "world": a.world, "batch_size": a.batch_size,
        "steps": total, "epochs": epochs_run,
        "train_seconds": round(max(g["train_seconds"] for g in gathered), 4),
        "samples_per_sec": round(sum(per_rank), 1),
        "test_accuracy": acc,
        "per_rank_samples_per_sec": [round(r, 1) for r in per_rank],
        "startup_seconds": round(startup, 3), "eval_seconds": round(eval_seconds, 3),
        "final_loss": round(final_loss, 6), "lr": a.lr, "seed": a.seed,
        "torch": torch.__version__,
    }
    print(json.dumps(result), flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    t_launch = time.perf_counter()
    a = parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"  # before torch/numpy load their thread pools
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pairs on loopback
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("cnn_ddp_torch.py: no torch here; run it with Debian's /usr/bin/python3 "
                 "(apt-get install python3-torch libopenblas0-pthread)")
    ctx = mp.spawn(run, args=(a, free_port(), t_launch), nprocs=a.world, join=False)
    deadline = time.monotonic() + a.timeout
    # join() raises if a rank failed (and terminates the others); bounded by --timeout.
    while not ctx.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
            sys.exit(f"cnn_ddp_torch.py: not done after --timeout {a.timeout:.0f} s; ranks killed")


if __name__ == "__main__":
    main()
