"""Baseline for the cluster's training throughput: PyTorch DistributedDataParallel (backend
"gloo", CPU) training the same MLP as our workers on Fashion-MNIST, N processes on this
machine, rendezvous on 127.0.0.1 (a free port).

Run it with Debian's interpreter and PyTorch (python3-torch 1.13) on OpenBLAS
(libopenblas0-pthread; see /work/shared/BENCHMARKING.md):

    /usr/bin/python3 bench/ddp_torch.py --world 2 --epochs 1
    /usr/bin/python3 bench/ddp_torch.py --world 2 --epochs 10
    /usr/bin/python3 bench/ddp_torch.py --world 1 --epochs 3   # single-process PyTorch

With --world 1 the model is not wrapped in DDP: plain single-process PyTorch (the baseline
"PS-mode training >= 1.5x a single process" is measured against), framework
"torch-single-process" in the JSON.

What matches our workers (worker/main.cc, worker/modes/*, worker/data/*, worker/model/*):
  - model: MLP --layers (default 784-256-128-64-10), Linear + ReLU between layers, mean
    softmax cross-entropy over the batch; the gradient is the mean over the ranks (DDP's
    all-reduce average = the ALLREDUCE placement's sum * 1/world).
  - optimizer: Adam, lr 1e-3, betas (0.9, 0.999), eps 1e-8 (PyTorch's defaults, the same
    float32 update as core/optimizer/optimizer.cc).
  - initial parameters: bit-for-bit those of modes::InitialState (core/init's uniform initializer) /
    PsTrainer::CreateTables: weights Glorot uniform from ps::InitDense (seed*1000 + 2l,
    SplitMix hash per element), biases zero.
  - data: the IDX .gz files of /usr/share/datasets/fashion-mnist read with gzip + numpy,
    pixels scaled to [0, 1] and normalised with mean 0.2860 / std 0.3530 in float32 exactly
    like data::LoadFashionMnist; each epoch a permutation of the whole training set equal to
    data::BatchIterator's (mt19937_64 seeded by EpochSeed(seed, epoch), the same Fisher-Yates
    and rejection sampling), rank r's batch at position p being permutation entries
    [(p*world + r)*B, (p*world + r + 1)*B): the same disjoint per-epoch shards, the same
    data order, steps per epoch = 60000 // (world*B).
  - one compute thread per process (--threads 1: torch.set_num_threads and
    OMP/OPENBLAS/MKL_NUM_THREADS, set before torch is imported).
  - evaluation: every rank evaluates the test set after each epoch (as our workers do),
    and that time is excluded from the training time.

Timing (the same as our workers' FinishSummary): each rank starts its clock just before
its first training step (NO warm-up steps are excluded: the first steps, with DDP's lazy
set-up and the allocator's first allocations, count, as they do for our workers) and stops
it after its last step, minus the time spent evaluating. Start-up (imports, data loading,
permutations, process group, DDP construction) is excluded and reported separately.
Every step counted includes fetching the batch from the in-memory dataset, forward,
backward with DDP's gradient all-reduce, and the Adam update.

samples/s (the definition deploy/local_cluster.sh uses for summary.json):
    per rank r:   steps * batch_size / train_seconds_r           (FinishSummary)
    total:        sum over ranks of the per-rank figures          (local_cluster.sh)
In lockstep DDP the ranks' train_seconds differ by milliseconds, so the total equals
steps * batch_size * world / train_seconds to within that; "train_seconds" in the JSON is
the slowest rank's. Progress lines show rank 0's own (per-rank) rate, like our workers'.

The last line on stdout is one JSON object:
    {"framework": "torch-ddp-gloo", "world": N, "batch_size": B, "steps": S,
     "train_seconds": T, "samples_per_sec": total, "test_accuracy": acc, ...}
"""
import argparse
import gc
import gzip
import json
import os
import socket
import sys
import time

FRAMEWORK = "torch-ddp-gloo"
MEAN, STD = 0.2860, 0.3530  # worker/data/dataset.h kFashionMnistMean / kFashionMnistStd
M64 = (1 << 64) - 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="processes (ranks)")
    p.add_argument("--batch_size", type=int, default=64, help="examples per step per rank")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--steps", type=int, default=0, help="cap on training steps (0: no cap)")
    p.add_argument("--threads", type=int, default=1, help="compute threads per process")
    p.add_argument("--layers", default="784,256,128,64,10", help="layer sizes, comma-separated")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1, help="data order and initial parameters")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--progress_seconds", type=float, default=5.0)
    p.add_argument("--no_eval", action="store_true", help="skip the per-epoch test evaluation")
    p.add_argument("--json", default="", help="also write the final JSON object here")
    a = p.parse_args(argv)
    a.layers = [int(x) for x in a.layers.split(",")]
    if a.world < 1 or a.batch_size < 1 or a.epochs < 1 or a.threads < 1 or a.steps < 0:
        p.error("--world, --batch_size, --epochs and --threads must be >= 1, --steps >= 0")
    if len(a.layers) < 2 or min(a.layers) < 1:
        p.error("--layers needs at least two positive sizes")
    return a


# ---------------------------------------------------------------- data (worker/data/*.cc)

def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    import numpy as np
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        raise SystemExit(f"{path}: bad magic 0x{got:08x}, want 0x{magic:08x}")
    count = int.from_bytes(raw[4:8], "big")
    if magic == 0x803:
        rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
        data = np.frombuffer(raw, dtype=np.uint8, offset=16)
        if data.size != count * rows * cols:
            raise SystemExit(f"{path}: truncated images")
        return data.reshape(count, rows * cols)
    data = np.frombuffer(raw, dtype=np.uint8, offset=8)
    if data.size != count or (data.size and data.max() >= 10):
        raise SystemExit(f"{path}: truncated labels or a label outside [0, 10)")
    return data


def load_fashion_mnist(data_dir, prefix):
    """data::LoadFashionMnist: x float32 [n, 784] = (p/255 - mean)/std in float32, y int64."""
    import numpy as np
    images = read_idx(f"{data_dir}/{prefix}-images-idx3-ubyte.gz", 0x803)
    labels = read_idx(f"{data_dir}/{prefix}-labels-idx1-ubyte.gz", 0x801)
    if len(images) != len(labels):
        raise SystemExit(f"{prefix}: {len(images)} images but {len(labels)} labels")
    lut = (np.arange(256, dtype=np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD)
    return lut[images], labels.astype(np.int64)


def mix64(z):  # worker/data/batches.cc Mix64 (no increment)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def epoch_seed(seed, epoch):  # batches.cc EpochSeed
    return mix64(mix64((seed + 0x9E3779B97F4A7C15) & M64) ^ ((epoch * 0xD1B54A32D192ED03 + 1) & M64))


class MT19937_64:
    """std::mt19937_64, the twist vectorised with numpy (three dependency-free segments)."""
    N, M, A = 312, 156, 0xB5026F5AA96619E9
    UM, LM = 0xFFFFFFFF80000000, 0x7FFFFFFF

    def __init__(self, seed):
        import numpy as np
        self.np = np
        mt = [seed & M64]
        for i in range(1, self.N):
            mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & M64)
        self.mt = np.array(mt, dtype=np.uint64)
        self.out, self.at = [], self.N

    def _twist(self):
        np, mt, N, M = self.np, self.mt, self.N, self.M
        u = lambda v: np.uint64(v)

        def step(i0, i1, nxt, far):
            x = (mt[i0:i1] & u(self.UM)) | (nxt & u(self.LM))
            xa = (x >> u(1)) ^ ((x & u(1)) * u(self.A))
            mt[i0:i1] = far ^ xa

        step(0, N - M, mt[1:N - M + 1].copy(), mt[M:N].copy())
        step(N - M, N - 1, mt[N - M + 1:N].copy(), mt[0:M - 1].copy())
        step(N - 1, N, mt[0:1].copy(), mt[M - 1:M].copy())
        y = mt.copy()
        y ^= (y >> u(29)) & u(0x5555555555555555)
        y ^= (y << u(17)) & u(0x71D67FFFEDA60000)
        y ^= (y << u(37)) & u(0xFFF7EEE000000000)
        y ^= y >> u(43)
        self.out, self.at = y.tolist(), 0

    def __call__(self):
        if self.at == self.N:
            self._twist()
        self.at += 1
        return self.out[self.at - 1]


def epoch_permutation(size, seed, epoch):
    """data::BatchIterator::EnsurePermutation: Fisher-Yates with UniformBelow(i + 1)."""
    import numpy as np
    rng = MT19937_64(epoch_seed(seed, epoch))
    perm = list(range(size))
    for i in range(size - 1, 0, -1):
        n = i + 1
        threshold = ((1 << 64) - n) % n
        r = rng()
        while r < threshold:
            r = rng()
        j = r % n
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, dtype=np.int64)


def initial_params(layers, seed):
    """modes::InitialState (core/init's uniform initializer): W[in x out] = scale*(2*Unit(Mix64(stream ^ Mix64(k))) - 1),
    stream = Mix64(seed*1000 + 2l), scale = sqrtf(6/(in+out)), Mix64 = common/sharding.cc's."""
    import numpy as np
    u = np.uint64

    def smix(x):  # common/sharding.cc Mix64 (with the golden-ratio increment), uint64 arrays
        x = x + u(0x9E3779B97F4A7C15)
        x = (x ^ (x >> u(30))) * u(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> u(27))) * u(0x94D049BB133111EB)
        return x ^ (x >> u(31))

    out = []
    with np.errstate(over="ignore"):
        for l in range(len(layers) - 1):
            fan_in, fan_out = layers[l], layers[l + 1]
            scale = np.sqrt(np.float32(6.0) / np.float32(fan_in + fan_out), dtype=np.float32)
            stream = smix(np.array([(seed * 1000 + 2 * l) & M64], dtype=np.uint64))[0]
            h = smix(stream ^ smix(np.arange(fan_in * fan_out, dtype=np.uint64)))
            unit = (h >> u(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
            w = scale * (np.float32(2.0) * unit - np.float32(1.0))
            out.append((w.reshape(fan_in, fan_out), np.zeros(fan_out, dtype=np.float32)))
    return out


# ---------------------------------------------------------------- one rank

def run(rank, a, port, t_launch):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    world, B = a.world, a.batch_size
    x_train, y_train, x_test, y_test = load_data(a)
    per_epoch, total = plan_steps(a, len(x_train))
    order = rank_batches(a, rank, len(x_train), per_epoch, (total + per_epoch - 1) // per_epoch)
    data = [torch.from_numpy(d) for d in (x_train, y_train, x_test, y_test)]
    model = build_mlp(a)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ddp = DDP(model) if world > 1 else model  # one process: plain PyTorch, no DDP hooks
    framework = FRAMEWORK if world > 1 else "torch-single-process"
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr)

    dist.barrier()  # every rank ready: start-up ends here
    startup = time.perf_counter() - t_launch
    if rank == 0:
        print(f"{framework}: world {world}, batch {B}/rank, {total} steps ({per_epoch}/epoch), "
              f"{a.threads} thread(s)/rank, torch {torch.__version__}; start-up {startup:.1f} s",
              flush=True)
    train_seconds, eval_time, acc, final_loss = train(a, rank, ddp, model, opt, order, data,
                                                      per_epoch, total)

    gathered = [None] * world
    dist.all_gather_object(gathered, {"train_seconds": train_seconds, "eval_seconds": eval_time,
                                      "test_accuracy": acc})
    # Tear down in an order that cannot deadlock (torch 1.13): if the Reducer drops the last
    # reference to the gloo process group, ~ProcessGroupGloo joins its worker threads with the
    # GIL held while one of them may still be freeing a Python-owned tensor of the last
    # collective (it waits for the GIL: a hang seen here). So: a barrier (its work owns no
    # Python tensors), free DDP while the default group still holds the process group, and
    # only then destroy the group, whose threads are idle by then.
    dist.barrier()
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()
    if rank != 0:
        return
    report(a, framework, total, gathered, acc, eval_time, startup, final_loss)


def load_data(a):
    """(x_train, y_train, x_test, y_test), the inputs checked against --layers."""
    x_train, y_train = load_fashion_mnist(a.data_dir, "train")
    x_test, y_test = load_fashion_mnist(a.data_dir, "t10k")
    if x_train.shape[1] != a.layers[0]:
        raise SystemExit(f"--layers starts with {a.layers[0]} but the data has {x_train.shape[1]} inputs")
    return x_train, y_train, x_test, y_test


def plan_steps(a, n_train):
    """(steps per epoch, steps in all): --steps caps the epochs' steps."""
    per_epoch = n_train // (a.world * a.batch_size)
    if per_epoch < 1:
        raise SystemExit("the data is smaller than one global batch")
    total = per_epoch * a.epochs if a.steps == 0 else min(a.steps, per_epoch * a.epochs)
    return per_epoch, total


def rank_batches(a, rank, n_train, per_epoch, epochs_run):
    """Each epoch's batches of this rank: [per_epoch, batch_size] indices into the data."""
    world, B = a.world, a.batch_size
    # Each rank's index sequence for every epoch, computed at start-up (it costs ~0.1 s per
    # epoch in Python; our workers build the permutation in C++ in ~1 ms inside the clock).
    order = []
    for e in range(epochs_run):
        perm = epoch_permutation(n_train, a.seed, e)
        order.append(perm[: per_epoch * world * B].reshape(per_epoch, world, B)[:, rank, :].copy())
    return order


def build_mlp(a):
    """The MLP of --layers with the workers' initial parameters (initial_params)."""
    import numpy as np
    import torch
    layers = []
    for l, (w, b) in enumerate(initial_params(a.layers, a.seed)):
        lin = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))  # torch: [out, in]
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if l + 2 < len(a.layers):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def evaluate(model, xe, ye):
    import torch
    model.eval()
    with torch.no_grad():
        correct = 0
        for i in range(0, len(xe), 10000):
            correct += int((model(xe[i:i + 10000]).argmax(1) == ye[i:i + 10000]).sum())
    model.train()
    return correct / len(xe)


def train(a, rank, ddp, model, opt, order, data, per_epoch, total):
    """The timed steps, evaluating after each epoch unless --no_eval; returns (training
    seconds, evaluation seconds, the last test accuracy, the last epoch's mean loss)."""
    import torch
    import torch.nn.functional as F
    xt, yt, xe, ye = data
    B, epochs_run = a.batch_size, len(order)
    acc, eval_time, epoch_loss, epoch_steps, final_loss = -1.0, 0.0, 0.0, 0, float("nan")
    start = time.perf_counter()
    last_report = start
    for step in range(total):
        e, p = divmod(step, per_epoch)
        idx = torch.from_numpy(order[e][p])
        x, y = xt.index_select(0, idx), yt.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        epoch_loss += loss.item()
        epoch_steps += 1
        now = time.perf_counter()
        if rank == 0 and (now - last_report >= a.progress_seconds or step + 1 == total):
            rate = (step + 1) * B / (now - start - eval_time)
            print(f"rank 0: epoch {e + 1}/{epochs_run} step {step + 1}/{total} "
                  f"loss {epoch_loss / epoch_steps:.4f} {rate:.0f} samples/s (this rank)", flush=True)
            last_report = now
        if (step + 1) % per_epoch == 0 or step + 1 == total:
            final_loss = epoch_loss / epoch_steps
            epoch_loss, epoch_steps = 0.0, 0
            if not a.no_eval:
                t0 = time.perf_counter()
                acc = evaluate(model, xe, ye)
                eval_time += time.perf_counter() - t0
                if rank == 0:
                    print(f"rank 0: epoch {e + 1} test accuracy {acc:.4f}", flush=True)
    return time.perf_counter() - start - eval_time, eval_time, acc, final_loss


def report(a, framework, total, gathered, acc, eval_time, startup, final_loss):
    """Rank 0's JSON line of the run (also written to --json)."""
    import torch
    per_rank = [total * a.batch_size / g["train_seconds"] for g in gathered]
    result = {
        "framework": framework, "world": a.world, "batch_size": a.batch_size, "steps": total,
        "train_seconds": round(max(g["train_seconds"] for g in gathered), 4),
        "samples_per_sec": round(sum(per_rank), 1), "test_accuracy": acc,
        "epochs": a.epochs, "steps_cap": a.steps, "threads_per_rank": a.threads,
        "per_rank_samples_per_sec": [round(r, 1) for r in per_rank],
        "per_rank_train_seconds": [round(g["train_seconds"], 4) for g in gathered],
        "eval_seconds": round(eval_time, 3), "startup_seconds": round(startup, 3),
        "final_loss": round(final_loss, 6), "warmup_steps_excluded": 0,
        "layers": a.layers, "lr": a.lr, "seed": a.seed, "torch": torch.__version__,
    }
    line = json.dumps(result)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    t_launch = time.perf_counter()
    a = parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)  # before torch/numpy load their thread pools
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pairs on loopback too
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("ddp_torch.py: no torch here; run it with Debian's /usr/bin/python3 "
                 "(apt-get install python3-torch libopenblas0-pthread)")
    mp.spawn(run, args=(a, free_port(), t_launch), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
