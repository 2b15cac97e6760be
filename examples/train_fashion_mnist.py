"""A PyTorch model (a CNN, or the MLP) on Fashion-MNIST, trained by N Python worker
processes through pscluster.

    # a cluster of its own (a coordinator and 2 shards on loopback), 2 workers, the CNN:
    /usr/bin/python3 examples/train_fashion_mnist.py --workers 2 --epochs 5
    # or through a running cluster (deploy/local_cluster.sh --workers 0 prints its address):
    /usr/bin/python3 examples/train_fashion_mnist.py --coordinator 127.0.0.1:7000
    # the MLP 784-256-128-64-10 (bench/torch_rpc_ps.py's):
    /usr/bin/python3 examples/train_fashion_mnist.py --model mlp --epochs 1

Each worker is a process with its own rank. All build the same CNN (same seed); worker 0
writes its initial values into the shards; every step each worker computes the gradient
of its part of the global batch (disjoint shards of each epoch's permutation) and
ParameterServerOptimizer.step() pushes it and pulls the new parameters in one round trip
per shard. Adam runs on the shards (BSP: the step applies the mean of the workers'
gradients, as DistributedDataParallel would). After each epoch every worker measures the
test accuracy (not counted in the training time) and worker 0 asks the coordinator for a
checkpoint filed under it (the coordinator keeps the best).

bench/cnn_ddp_torch.py trains the same CNN with DistributedDataParallel, and
bench/torch_rpc_ps.py the MLP with PyTorch's RPC parameter server, for comparison. The last line is a JSON summary: samples/s (sum over workers of steps * batch /
training seconds) and the test accuracy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# The client from the checkout (python/, stubs under bazel-bin/python) unless installed.
for p in (os.path.join(REPO, "bazel-bin", "python"), os.path.join(REPO, "python"), HERE):
    if os.path.isdir(p) and p not in sys.path:
        sys.path.insert(0, p)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--coordinator", default=os.environ.get("PSCLUSTER_COORDINATOR", ""),
                   help="HOST:PORT of a running cluster's coordinator (default: "
                        "$PSCLUSTER_COORDINATOR, else start a local cluster)")
    p.add_argument("--local-shards", type=int, default=2,
                   help="shards of the local cluster started without --coordinator")
    p.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max_steps", type=int, default=0, help="stop each worker after this many")
    p.add_argument("--batch_size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--consistency", default="bsp", help="bsp, ssp or asp")
    p.add_argument("--staleness", type=int, default=0, help="ssp's bound")
    p.add_argument("--overlap", action="store_true",
                   help="push/pull in the background while the next step computes (ssp with "
                        "--staleness >= 1, or asp)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per RPC")
    p.add_argument("--out", default="", help="directory for the local cluster's logs and "
                                             "checkpoints (default: a temporary one)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)  # a worker
    args = p.parse_args(argv)
    for name in ("local_shards", "workers", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-') if name == 'local_shards' else name} must be "
                    f">= 1, got {getattr(args, name)}")
    if args.max_steps < 0 or args.staleness < 0 or not args.timeout > 0:
        p.error("--max_steps and --staleness must be >= 0, --timeout > 0")
    if not 0 < args.lr < float("inf"):
        p.error(f"--lr must be a finite number > 0, got {args.lr}")
    return args


def worker(args) -> dict:
    import torch
    import fashion_mnist as fm

    torch.set_num_threads(1)
    rank, world = args.rank, args.workers
    images, labels = fm.load("train")
    test_images, test_labels = fm.load("test")
    cluster, model, opt = connect_and_build(args)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps_per_epoch = len(images) // (world * args.batch_size)
    total = steps_per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    step, train_seconds, accuracy, loss = 0, 0.0, 0.0, float("nan")
    compute_seconds = 0.0  # forward + backward; the rest of a step is opt.step()
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for b in fm.batches(len(images), args.batch_size, rank, world, epoch, args.seed):
            if step >= total:
                break
            t0 = time.perf_counter()
            x, y = torch.from_numpy(images[b]), torch.from_numpy(labels[b])
            opt.zero_grad()
            out = loss_fn(model(x), y)
            out.backward()
            compute_seconds += time.perf_counter() - t0
            opt.step()
            step += 1
            loss = out.item()
            if rank == 0 and (step % 100 == 0 or step == total):
                elapsed = train_seconds + time.perf_counter() - start
                rate = step * args.batch_size / elapsed
                eta = (total - step) * args.batch_size / rate
                print(f"step {step}/{total} epoch {epoch} loss {loss:.4f} "
                      f"{rate:,.0f} samples/s (this worker) ETA {eta:.0f} s", flush=True)
        opt.flush()  # overlap: the last step's values into the model
        train_seconds += time.perf_counter() - start
        accuracy = fm.accuracy(model, test_images, test_labels)
        if rank == 0:
            report_epoch(cluster, epoch, accuracy)
        if step >= total:
            break
    cluster.unregister_worker(rank)
    cluster.close()
    if rank == 0:
        print(f"per step: compute (batch, forward, backward) {1e3 * compute_seconds / step:.2f} "
              f"ms, push + pull {1e3 * (train_seconds - compute_seconds) / step:.2f} ms",
              flush=True)
    return {"rank": rank, "steps": step, "train_seconds": train_seconds,
            "compute_seconds": compute_seconds,
            "samples_per_sec": step * args.batch_size / train_seconds,
            "test_accuracy": accuracy, "loss": loss}


def connect_and_build(args):
    """The cluster, the model and its optimizer: every worker builds the same ones."""
    import torch
    import pscluster
    import pscluster.torch as pst
    import fashion_mnist as fm

    cluster = pscluster.connect(args.coordinator, timeout=args.timeout,
                                wait_until_complete=True)
    torch.manual_seed(args.seed)
    model = fm.make_cnn() if args.model == "cnn" else fm.make_mlp()
    opt = pst.ParameterServerOptimizer(
        model, cluster, optimizer="adam", lr=args.lr, consistency=args.consistency,
        staleness=args.staleness, worker=args.rank, num_workers=args.workers,
        name=args.model, wait_timeout=120.0, overlap=args.overlap)
    return cluster, model, opt


def report_epoch(cluster, epoch, accuracy):
    """Worker 0 prints the epoch's test accuracy and asks for a checkpoint filed under it."""
    import pscluster
    print(f"epoch {epoch}: test accuracy {accuracy:.4f}", flush=True)
    try:
        c = cluster.checkpoint(metric=accuracy, timeout=120.0)
        print(f"epoch {epoch}: checkpoint of step {c['step']}", flush=True)
    except pscluster.PsError as e:  # e.g. shards without --data_dir
        print(f"epoch {epoch}: no checkpoint ({e.message})", flush=True)


def main() -> int:
    args = parse_args()
    if args.rank >= 0:
        summary = worker(args)
        with open(os.path.join(args.out, f"worker{args.rank}.json"), "w") as f:
            json.dump(summary, f)
        return 0
    import tempfile
    import pscluster.local

    temporary = not args.out  # removed after a run that succeeds; kept to read if not
    out = args.out = args.out or tempfile.mkdtemp(prefix="train_fashion_mnist_")
    os.makedirs(out, exist_ok=True)
    local = None
    try:
        if not args.coordinator:
            local = pscluster.local.LocalCluster(num_shards=args.local_shards, data_dir=out,
                                                 log_dir=out)
            args.coordinator = local.coordinator
            print(f"local cluster: coordinator {local.coordinator}, shards {local.addresses}; "
                  f"logs and checkpoints in {out}", flush=True)
        if not pscluster.local.run_workers(__file__, sys.argv[1:], args.workers,
                                           args.coordinator, out):
            print(f"the run's logs are kept in {out}", file=sys.stderr)
            return 1
    finally:
        if local:
            local.stop()
    workers = [json.load(open(os.path.join(out, f"worker{r}.json"))) for r in range(args.workers)]
    print(json.dumps({
        "example": "train_fashion_mnist", "framework": "pscluster", "model": args.model,
        "workers": args.workers,
        "shards": args.local_shards if local else None,  # a running cluster: its own
        "consistency": args.consistency, "batch_size": args.batch_size,
        "epochs": args.epochs, "steps": workers[0]["steps"],
        "train_seconds": max(w["train_seconds"] for w in workers),
        "samples_per_sec": sum(w["samples_per_sec"] for w in workers),
        "test_accuracy": workers[0]["test_accuracy"]}))
    if temporary:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
