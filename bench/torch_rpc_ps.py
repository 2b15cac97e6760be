"""Baseline: PyTorch's own parameter-server recipe (torch.distributed.rpc, TensorPipe) training
the MLP 784-256-128-64-10 on Fashion-MNIST with one PS and --trainers trainer processes.

Run it with Debian's interpreter (python3-torch 1.13 on OpenBLAS, see
/work/shared/BENCHMARKING.md):

    /usr/bin/python3 bench/torch_rpc_ps.py --max_steps 300    # quick check
    /usr/bin/python3 bench/torch_rpc_ps.py --epochs 1

The recipe is pytorch/examples' batch-updating parameter server
(examples/distributed/rpc/batch/parameter_server.py, and the tutorial "Implementing Batch
RPC Processing Using Asynchronous Executions"): rank 0 ("ps") owns the model and the
optimizer behind an RRef and starts every trainer with rpc_async(run_trainer); each step a
trainer computes its gradients and calls the @rpc.functions.async_execution function
update_and_fetch_model on the PS, which adds them to its accumulator and returns a shared
Future; the last trainer of the step to arrive divides by the number of trainers (the mean,
as DDP does), runs Adam's step and completes that Future with the new parameters, which
answers every trainer at once (BSP: synchronous, one update per step). Each trainer loads
the returned parameters into its local copy and goes on. Two deliberate differences from
the example: the accumulation runs under the lock (the example adds outside it, a race
between RPC threads), and the PS returns the parameters as a list of tensors, not the
pickled nn.Module.

What matches the cluster's ps placement on the same MLP (and bench/ddp_torch.py):
  - model: fashion_mnist.make_mlp() (784-256-128-64-10, ReLU between layers), mean softmax
    cross-entropy over each trainer's batch of --batch_size (64); PyTorch's default init
    after torch.manual_seed(seed) on the PS, fetched by every trainer before its clock starts.
  - optimizer: torch.optim.Adam, lr 1e-3, PyTorch's defaults, on the PS only.
  - data: fashion_mnist.load / fashion_mnist.batches: one permutation per epoch from
    numpy's default_rng(seed*1000 + epoch), trainer t (0-based) takes the disjoint shard
    entries [(p*N + t)*B, (p*N + t + 1)*B) at step p; steps per epoch = 60000 // (N*B).
  - one compute thread per process (torch.set_num_threads(1), OMP/OPENBLAS/MKL_NUM_THREADS=1
    before torch is imported). On 2 cores the PS process shares them with the trainers.
  - transport: TensorPipe with its defaults (on one machine it may pick its shared-memory
    transport and CMA channel; --tcp_only forces the uv TCP transport and the basic
    channel, like the cluster's loopback gRPC), init_method tcp://127.0.0.1:<free port>,
    rpc_timeout --rpc_timeout (120 s) for every step's RPC.

Timing (like the workers' FinishSummary): each trainer's clock starts just before its first
step and stops after its last; start-up and the PS's final test evaluation are excluded.
Every step includes taking the batch, forward, backward, the gradient RPC and its wait for
the other trainers and the update, and loading the new parameters.
    samples_per_sec = sum over trainers of steps * batch_size / train_seconds_t
"train_seconds" is the slowest trainer's. Progress lines come from trainer 1 (rank 1), each
with the loss averaged since the last line, the rate summed over trainers as trainer 1 sees
it (its own rate x N) and the ETA; "final_loss" is its mean loss over the last interval.

The last line on stdout is one JSON object:
    {"framework": "torch-rpc-ps", "model": "mlp", "trainers": N, "batch_size": 64,
     "steps": S, "train_seconds": T, "samples_per_sec": X, "test_accuracy": A, ...a few
     more fields (epochs, per-trainer figures, start-up, loss)}
"""
import argparse
import json
import os
import socket
import sys
import threading
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before torch/numpy load their thread pools, in every process
os.environ.setdefault("TP_SOCKET_IFNAME", "lo")  # TensorPipe's uv transport on loopback

try:
    import torch
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_rpc_ps.py: no torch here; run it with Debian's /usr/bin/python3 "
             "(apt-get install python3-torch libopenblas0-pthread)")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import fashion_mnist as fm  # noqa: E402

FRAMEWORK = "torch-rpc-ps"
SHUTDOWN_SECONDS = 60  # rpc.shutdown's bound beyond --timeout (trainers wait there while training)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainers", type=int, default=2, help="trainer processes (world = trainers + 1)")
    p.add_argument("--batch_size", type=int, default=64, help="examples per step per trainer")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0, help="cap on training steps (0: none)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1, help="initial parameters and data order")
    p.add_argument("--progress_every", type=int, default=100, help="steps between progress lines")
    p.add_argument("--rpc_timeout", type=float, default=120.0, help="seconds, every step's RPC")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds for the whole training (run_trainer's RPC and the launcher)")
    p.add_argument("--tcp_only", action="store_true",
                   help="TensorPipe's uv (TCP) transport and basic channel only")
    a = p.parse_args(argv)
    if a.trainers < 1 or a.batch_size < 1 or a.epochs < 1 or a.max_steps < 0:
        p.error("--trainers, --batch_size and --epochs must be >= 1, --max_steps >= 0")
    return a


# ---------------------------------------------------------------- the parameter server (rank 0)

class BatchUpdateParameterServer:
    """Owns the model and Adam; one update per step once every trainer's gradients are in.
    Thread-safe: RPC threads call update_and_fetch_model concurrently."""

    def __init__(self, num_trainers, lr, seed):
        torch.manual_seed(seed)
        self.model = fm.make_mlp()
        self.params = list(self.model.parameters())
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.optimizer = torch.optim.Adam(self.params, lr=lr)
        self.lock = threading.Lock()
        self.num_trainers = num_trainers
        self.arrived = 0
        self.future = torch.futures.Future()

    def get_params(self):
        return [p.detach().clone() for p in self.params]

    @staticmethod
    def fetch_params(ps_rref):
        return ps_rref.local_value().get_params()

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        """Runs on the PS in an RPC thread: returns the step's shared Future, which the
        last trainer to arrive completes with the updated parameters."""
        self = ps_rref.local_value()
        with self.lock:
            for p, g in zip(self.params, grads):
                p.grad += g
            self.arrived += 1
            fut = self.future
            if self.arrived == self.num_trainers:
                for p in self.params:
                    p.grad /= self.num_trainers  # the mean over trainers, as DDP's all-reduce
                self.optimizer.step()
                for p in self.params:
                    p.grad.zero_()
                self.arrived = 0
                self.future = torch.futures.Future()
                fut.set_result(self.get_params())
        return fut


# ---------------------------------------------------------------- a trainer (ranks 1..N)

TRAINER = {}  # a trainer process's data and settings, set in process() before init_rpc


def run_trainer(ps_rref, trainer_index):
    """The training loop, started by the PS with rpc_async; returns this trainer's figures."""
    a, xt, yt = TRAINER["args"], TRAINER["x"], TRAINER["y"]
    T, B = a.trainers, a.batch_size
    per_epoch = len(xt) // (T * B)
    if per_epoch < 1:
        raise ValueError(f"{len(xt)} training examples are fewer than one step's {T} x {B}")
    total = per_epoch * a.epochs if a.max_steps == 0 else min(a.max_steps, per_epoch * a.epochs)
    epochs_run = (total + per_epoch - 1) // per_epoch
    order = [fm.batches(len(xt), B, trainer_index, T, e, a.seed) for e in range(epochs_run)]
    model = fm.make_mlp()
    params = list(model.parameters())
    with torch.no_grad():
        for p, v in zip(params, rpc.rpc_sync(ps_rref.owner(), BatchUpdateParameterServer.fetch_params,
                                             args=(ps_rref,), timeout=a.rpc_timeout)):
            p.copy_(v)
    report = trainer_index == 0
    if report:
        print(f"{FRAMEWORK}: mlp ({sum(p.numel() for p in params)} parameters), {T} trainers + 1 PS, "
              f"batch {B}/trainer, {total} steps ({per_epoch}/epoch), 1 thread/process, "
              f"torch {torch.__version__}{', tcp only' if a.tcp_only else ''}", flush=True)

    loss_sum, loss_n, final_loss = 0.0, 0, float("nan")
    start = time.perf_counter()
    for step in range(total):
        e, p = divmod(step, per_epoch)
        idx = torch.from_numpy(order[e][p])
        x, y = xt.index_select(0, idx), yt.index_select(0, idx)
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        fut = rpc.rpc_async(ps_rref.owner(), BatchUpdateParameterServer.update_and_fetch_model,
                            args=(ps_rref, [q.grad for q in params]), timeout=a.rpc_timeout)
        new_params = fut.wait()
        with torch.no_grad():
            for q, v in zip(params, new_params):
                q.copy_(v)
        loss_sum += loss.item()
        loss_n += 1
        if report and ((step + 1) % a.progress_every == 0 or step + 1 == total):
            elapsed = time.perf_counter() - start
            eta = elapsed / (step + 1) * (total - step - 1)
            print(f"trainer 1: epoch {e + 1}/{epochs_run} step {step + 1}/{total} "
                  f"loss {loss_sum / loss_n:.4f} {(step + 1) * B * T / elapsed:.0f} samples/s "
                  f"(all trainers) ETA {eta:.0f} s", flush=True)
            final_loss, loss_sum, loss_n = loss_sum / loss_n, 0.0, 0
    train_seconds = time.perf_counter() - start
    return {"steps": total, "epochs": epochs_run, "train_seconds": train_seconds,
            "final_loss": final_loss}


# ---------------------------------------------------------------- processes

def run_ps(a, t_launch):
    x_test, y_test = fm.load("test")
    ps = BatchUpdateParameterServer(a.trainers, a.lr, a.seed)
    ps_rref = rpc.RRef(ps)
    startup = time.perf_counter() - t_launch
    futs = [rpc.rpc_async(f"trainer{t + 1}", run_trainer, args=(ps_rref, t), timeout=a.timeout)
            for t in range(a.trainers)]
    stats = [f.wait() for f in futs]  # each bounded by --timeout; an error raises here
    t0 = time.perf_counter()
    acc = fm.accuracy(ps.model, x_test, y_test)
    eval_seconds = time.perf_counter() - t0
    B = a.batch_size
    per_trainer = [s["steps"] * B / s["train_seconds"] for s in stats]
    result = {
        "framework": FRAMEWORK, "model": "mlp", "trainers": a.trainers, "batch_size": B,
        "steps": stats[0]["steps"], "epochs": stats[0]["epochs"],
        "train_seconds": round(max(s["train_seconds"] for s in stats), 4),
        "samples_per_sec": round(sum(per_trainer), 1),
        "test_accuracy": acc,
        "per_trainer_samples_per_sec": [round(r, 1) for r in per_trainer],
        "startup_seconds": round(startup, 3), "eval_seconds": round(eval_seconds, 3),
        "final_loss": round(stats[0]["final_loss"], 6), "lr": a.lr, "seed": a.seed,
        "tcp_only": a.tcp_only, "torch": torch.__version__,
    }
    return json.dumps(result)


def process(rank, a, port, t_launch):
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if rank > 0:  # load the data before joining, so no trainer's first step waits for it
        x, y = fm.load("train")
        TRAINER.update(args=a, x=torch.from_numpy(x), y=torch.from_numpy(y))
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16, rpc_timeout=a.rpc_timeout, init_method=f"tcp://127.0.0.1:{port}",
        _transports=["uv"] if a.tcp_only else None, _channels=["basic"] if a.tcp_only else None)
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=a.trainers + 1, rpc_backend_options=opts)
    line = None
    try:
        if rank == 0:
            line = run_ps(a, t_launch)
    finally:
        # Graceful: waits until every process has reached it with no outstanding work. The
        # trainers wait here while they train (run_trainer runs in an RPC thread), hence the
        # bound of --timeout plus a margin rather than a few seconds.
        rpc.shutdown(graceful=True, timeout=a.timeout + SHUTDOWN_SECONDS)
    if line:
        print(line, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    t_launch = time.perf_counter()
    a = parse_args()
    ctx = mp.spawn(process, args=(a, free_port(), t_launch), nprocs=a.trainers + 1, join=False)
    deadline = time.monotonic() + a.timeout + 3 * SHUTDOWN_SECONDS
    # join() raises if a process failed (and terminates the others); bounded by the deadline.
    while not ctx.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
            sys.exit("torch_rpc_ps.py: processes still running past the deadline; killed")


if __name__ == "__main__":
    main()
