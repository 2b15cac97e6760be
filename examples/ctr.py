"""Click-through-rate prediction: embeddings + MLP over a 10-million-row sparse table, trained
by N Python worker processes through pscluster, scored against the data's known optimum.

    # a cluster of its own (a coordinator and 2 shards on loopback), 2 workers, BSP:
    /usr/bin/python3 examples/ctr.py
    # or through a running cluster (deploy/local_cluster.sh --workers 0 prints its address):
    /usr/bin/python3 examples/ctr.py --coordinator 127.0.0.1:7000 --workers 2

The data (examples/ctr_data.py) is synthetic with a known generating model: 8 categorical
fields, 10,111,100 ids in all, Zipf-distributed, labels from a hidden logistic model, so
the Bayes-optimal AUC (that of the true click probabilities) is known and the example can
say how close the model gets to it.

The model: every field's id is a GLOBAL key (field offset + id) of ONE sparse table of
dim-8 rows (pscluster.torch.Embedding, key space 10,111,100: only the rows training
touches are ever stored, on the shard the key hashes to); the 8 rows are concatenated
into an MLP 64 -> 256 -> 128 -> 64 -> 1 (ReLU), trained with BCEWithLogitsLoss. The MLP's
parameters are dense tables, updated by Adam on the shards. The embedding rows use
Adagrad, also on the shards, with an initial accumulator (--emb_init_acc 10) and
gradients in per-example units (--emb_grad sum): a row's step is lr * g / sqrt(10 + sum of
its g^2), so an id seen a few times moves by small SGD-like steps (shrunk towards its
random start, as a prior would) while a popular id gets Adagrad's decaying steps. Plain
Adagrad (no initial accumulator) moves a row by about lr on its first update whatever the
gradient: it memorises the rare ids' labels and overfits from the second epoch on (held-out
gap 0.0125 after one epoch, 0.021 after two, with --emb_lr 0.2). Adam on the rows
(--emb_optimizer adam --emb_lr 0.01) does not overfit in two epochs but learns more
slowly (gap 0.0082 against 0.0071) and keeps two slots per value instead of one.

Each worker is a process with its own rank that generates only its own contiguous shard
of the training set (the generator is reproducible row by row) and shuffles it every
epoch. Each step it pulls the rows of its batch (pull_sparse: each distinct key once, to
the shard that owns it), computes the gradient, and ParameterServerOptimizer.step()
pushes the rows' gradients and the MLP's (and pulls the MLP's new values) in one round
trip per shard. BSP (default): a step applies the workers' gradients together, in
worker order (the MLP's mean, as DistributedDataParallel would; the rows' per-example
sums); --consistency asp/ssp let workers run ahead.

Worker 0 then evaluates on held-out data in eval mode (pulls only, nothing pushed),
reports its AUC next to the Bayes-optimal AUC on the same examples, and the rows each
shard materialised (DescribeTable's num_rows). The launcher adds how many held-out ids
training never saw. The last line of stdout is a JSON summary.

Measured on 2 cores (2 workers, 2 shards, BSP, the defaults: 2M examples, 2 epochs,
1024 per worker per step): held-out AUC 0.8135 against the Bayes-optimal 0.8206 (gap
0.0071; seeds 1 and 2: 0.0084, 0.0058), 43,000-56,000 samples/s, 71-93 s of training,
82-105 s in all (the machine shared); 451,197 of the 10,111,100 rows materialised. BSP
runs are reproducible to the bit.
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
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--consistency", default="bsp", help="bsp, ssp or asp")
    p.add_argument("--staleness", type=int, default=0, help="ssp's bound")
    p.add_argument("--train", type=int, default=2_000_000, help="training examples")
    p.add_argument("--test", type=int, default=200_000, help="held-out examples")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=1024, help="per worker")
    p.add_argument("--dim", type=int, default=8, help="embedding dimension")
    p.add_argument("--hidden", default="256,128,64", help="the MLP's hidden layer sizes")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam, the MLP")
    p.add_argument("--emb_optimizer", default="adagrad", help="the embeddings' optimizer")
    p.add_argument("--emb_lr", type=float, default=0.5, help="the embeddings' learning rate")
    p.add_argument("--emb_init_acc", type=float, default=10.0,
                   help="Adagrad's initial accumulator for every embedding value (the "
                        "rows' gradients are per-example sums, see --emb_grad)")
    p.add_argument("--emb_grad", default="sum", choices=("sum", "mean"),
                   help="the rows' gradients pushed: of the sum of the global batch's "
                        "losses (default) or of their mean, like the MLP's")
    p.add_argument("--emb_scale", type=float, default=0.05,
                   help="embedding rows start N(0, scale^2)")
    p.add_argument("--seed", type=int, default=0, help="the data's and the model's seed")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per RPC")
    p.add_argument("--table_base", type=int, default=3000,
                   help="first table id (a second run against the same running cluster "
                        "needs another one: the tables keep their steps)")
    p.add_argument("--eval_every_epoch", type=int, default=1,
                   help="1: worker 0 also reports the held-out AUC after every epoch")
    p.add_argument("--log_every", type=int, default=200, help="steps between progress lines")
    p.add_argument("--out", default="", help="directory for logs and the workers' results "
                                             "(default: a temporary one)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)  # a worker
    args = p.parse_args(argv)
    for name in ("local_shards", "workers", "epochs", "batch_size", "test", "dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-') if name == 'local_shards' else name} must be "
                    f">= 1, got {getattr(args, name)}")
    if args.train < args.workers * args.batch_size:
        p.error(f"--train={args.train} is less than one step of every worker "
                f"(--workers x --batch_size = {args.workers * args.batch_size})")
    if args.staleness < 0 or not args.timeout > 0 or args.log_every < 1:
        p.error("--staleness must be >= 0, --timeout > 0, --log_every >= 1")
    for name in ("lr", "emb_lr", "emb_scale"):
        if not 0 < getattr(args, name) < float("inf"):
            p.error(f"--{name} must be a finite number > 0, got {getattr(args, name)}")
    if args.train + args.test > 100_000_000:
        p.error("--train + --test must be at most 100,000,000 (the data set is made in memory)")
    return args


def build_model(args, cluster, key_space, num_fields):
    """Embedding (one sparse table over every field's keys) -> concat -> MLP -> logit."""
    import torch
    import pscluster.torch as pst

    emb_fields = {}
    if args.emb_optimizer.lower() in ("adagrad", "ftrl"):
        emb_fields["initial_accumulator"] = args.emb_init_acc

    class CtrModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = pst.Embedding(
                cluster, "ctr/embedding", key_space, args.dim,
                optimizer=args.emb_optimizer, lr=args.emb_lr, consistency=args.consistency,
                staleness=args.staleness, initializer="normal", scale=args.emb_scale,
                seed=args.seed + 1, **emb_fields)
            sizes = [num_fields * args.dim] + [int(h) for h in args.hidden.split(",") if h]
            layers = []
            for a, b in zip(sizes[:-1], sizes[1:]):
                layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
            layers.append(torch.nn.Linear(sizes[-1], 1))
            self.mlp = torch.nn.Sequential(*layers)

        def forward(self, keys):  # keys: int64 [batch, fields] of global keys
            rows = self.embedding(keys)  # [batch, fields, dim]
            return self.mlp(rows.reshape(keys.shape[0], -1)).squeeze(1)

    return CtrModel()


def predict(model, keys, batch=8192):
    """Click probabilities of `keys` (int64 [n, fields]) in eval mode: pulls only."""
    import numpy as np
    import torch
    model.eval()
    out = np.empty(len(keys), dtype=np.float32)
    with torch.no_grad():
        for i in range(0, len(keys), batch):
            out[i:i + batch] = torch.sigmoid(model(torch.from_numpy(keys[i:i + batch]))).numpy()
    return out


def worker(args) -> dict:
    import torch
    import ctr_data

    torch.set_num_threads(1)
    rank, world = args.rank, args.workers
    data = ctr_data.Model(args.seed)
    t0 = time.perf_counter()
    lo, hi = args.train * rank // world, args.train * (rank + 1) // world
    keys, labels, _ = data.generate(args.train, "train", lo, hi)
    gen_seconds = time.perf_counter() - t0
    cluster, model, opt = connect_and_build(args, data)
    heldout = None  # worker 0 evaluates: (keys, labels, true probabilities, Bayes AUC)
    if rank == 0:
        print(f"worker 0: {hi - lo:,} training examples generated in {gen_seconds:.1f} s; "
              f"table {model.embedding.table}: {data.key_space:,} keys x dim {args.dim} on "
              f"{cluster.num_shards} shards", flush=True)
        test_keys, test_labels, test_probs = data.generate(args.test, "test")
        heldout = test_keys, test_labels, test_probs, ctr_data.bayes_auc(test_labels, test_probs)
    step, total, train_seconds, used = train(args, model, opt, keys, labels, heldout)
    summary = {"rank": rank, "steps": step, "train_seconds": train_seconds,
               "samples": step * args.batch_size, "gen_seconds": gen_seconds}
    save_training_results(args, keys[used], summary)
    if rank == 0:
        final_evaluation(args, cluster, model, opt, data, heldout, total, summary)
    cluster.unregister_worker(rank)
    cluster.close()
    return summary


def connect_and_build(args, data):
    """The cluster, the model and its optimizer: every worker builds the same ones."""
    import torch
    import pscluster
    import pscluster.torch as pst

    cluster = pscluster.connect(args.coordinator, timeout=args.timeout,
                                wait_until_complete=True)
    torch.manual_seed(args.seed)  # the same initial MLP on every worker
    model = build_model(args, cluster, data.key_space, data.num_fields)
    opt = pst.ParameterServerOptimizer(
        model, cluster, optimizer="adam", lr=args.lr, consistency=args.consistency,
        staleness=args.staleness, worker=args.rank, num_workers=args.workers, name="ctr",
        table_base=args.table_base, wait_timeout=300.0)
    if args.emb_grad == "sum":
        # The optimizer scales every gradient by 1/workers (a BSP step sums the workers'
        # pushes: the gradient of the global batch's mean loss). For the rows, undo the
        # mean over the batch instead: each occurrence of an id then adds its own
        # gradient, whatever the batch size, and Adagrad's accumulator (starting at
        # --emb_init_acc) is in the units of one example's squared gradient.
        model.embedding.grad_scale = float(args.batch_size)
    return cluster, model, opt


def train(args, model, opt, keys, labels, heldout):
    """Every epoch over this worker's examples; returns (steps, steps planned, training
    seconds, which examples a step took)."""
    import numpy as np
    import torch
    import ctr_data

    rank, world, B = args.rank, args.workers, args.batch_size
    loss_fn = torch.nn.BCEWithLogitsLoss()
    steps_per_epoch = (args.train // world) // B  # the same for every worker (BSP)
    total = steps_per_epoch * args.epochs
    step, loss_sum, loss_n, train_seconds = 0, 0.0, 0, 0.0
    used = np.zeros(len(keys), dtype=bool)
    for epoch in range(args.epochs):
        order = np.random.default_rng([args.seed, epoch, rank]).permutation(len(keys))
        used[order[:steps_per_epoch * B]] = True  # the tail of the shard waits an epoch
        model.train()
        start = time.perf_counter()
        for s in range(steps_per_epoch):
            idx = order[s * B:(s + 1) * B]
            x, y = torch.from_numpy(keys[idx]), torch.from_numpy(labels[idx])
            opt.zero_grad()
            out = loss_fn(model(x), y)
            out.backward()
            opt.step()
            step += 1
            loss_sum += out.item()
            loss_n += 1
            if rank == 0 and (step % args.log_every == 0 or step == total):
                elapsed = train_seconds + time.perf_counter() - start
                rate = step * B * world / elapsed  # every worker runs as many steps
                print(f"step {step}/{total} epoch {epoch} loss {loss_sum / loss_n:.4f} "
                      f"{rate:,.0f} samples/s (all workers) ETA "
                      f"{(total - step) * B * world / rate:.0f} s", flush=True)
                loss_sum, loss_n = 0.0, 0
        train_seconds += time.perf_counter() - start
        if rank == 0 and epoch + 1 < args.epochs and args.eval_every_epoch:
            # Not counted as training time; under BSP the others wait at the next step.
            test_keys, test_labels, _, bayes = heldout
            auc = ctr_data.auc(test_labels, predict(model, test_keys))
            print(f"epoch {epoch}: held-out AUC {auc:.4f} (Bayes-optimal {bayes:.4f}, "
                  f"gap {bayes - auc:.4f})", flush=True)
    return step, total, train_seconds, used


def write_summary(args, summary):
    with open(os.path.join(args.out, f"worker{args.rank}.json"), "w") as f:
        json.dump(summary, f)


def save_training_results(args, trained_keys, summary):
    """The keys this worker trained on, and how often (per epoch), for the launcher's report
    of how many held-out ids training never saw; then the worker's summary."""
    import numpy as np
    uniq, counts = np.unique(trained_keys, return_counts=True)
    np.savez(os.path.join(args.out, f"train_keys{args.rank}.npz"), keys=uniq, counts=counts)
    write_summary(args, summary)


def final_evaluation(args, cluster, model, opt, data, heldout, total, summary):
    """Worker 0's held-out AUC and losses of the final model, added to its summary."""
    import numpy as np
    import ctr_data

    # Once every worker has pushed its last step: under BSP they have when this one has;
    # under ASP/SSP the others may still be running, so wait for their summaries, then
    # pull the final dense values.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not all(os.path.exists(
            os.path.join(args.out, f"worker{r}.json")) for r in range(args.workers)):
        time.sleep(0.2)
    for t, (n, p) in zip(opt.tables, opt.params):
        cluster.pull_dense(t, step=total, worker=args.rank, out=p.data.numpy().reshape(-1))
    test_keys, test_labels, test_probs, bayes = heldout
    t0 = time.perf_counter()
    probs = predict(model, test_keys)
    eval_seconds = time.perf_counter() - t0
    auc = ctr_data.auc(test_labels, probs)
    rows = [int(i.num_rows) for i in cluster.describe(model.embedding.table)]
    np.savez(os.path.join(args.out, "eval.npz"), keys=test_keys, labels=test_labels,
             true_probs=test_probs, probs=probs)

    def log_loss(p):
        p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
        return float(np.mean(-test_labels * np.log(p) - (1 - test_labels) * np.log(1 - p)))

    summary.update(auc=auc, bayes_auc=bayes, rows_per_shard=rows, eval_seconds=eval_seconds,
                   test_loss=log_loss(probs), bayes_loss=log_loss(test_probs))
    print(f"held-out: {args.test:,} examples, AUC {auc:.4f}, Bayes-optimal AUC {bayes:.4f}, "
          f"gap {bayes - auc:.4f}; log loss {summary['test_loss']:.4f} (Bayes "
          f"{summary['bayes_loss']:.4f}); evaluated in {eval_seconds:.1f} s", flush=True)
    print(f"rows materialised per shard: {rows} (total {sum(rows):,} of "
          f"{data.key_space:,} keys)", flush=True)
    write_summary(args, summary)


def seen_report(out: str, world: int) -> dict:
    """How often training saw each held-out (example, field) id, and the AUC on the held-out
    examples by the rarest id they carry."""
    import numpy as np
    import ctr_data
    ev = np.load(os.path.join(out, "eval.npz"))
    test_keys = ev["keys"]
    flat = test_keys.reshape(-1)
    seen = np.zeros(flat.size, dtype=np.int64)
    for r in range(world):
        tk = np.load(os.path.join(out, f"train_keys{r}.npz"))
        pos = np.minimum(np.searchsorted(tk["keys"], flat), tk["keys"].size - 1)
        seen += np.where(tk["keys"][pos] == flat, tk["counts"][pos], 0)
    seen = seen.reshape(test_keys.shape)
    rarest = seen.min(1)
    report = {"never_seen": float(np.mean(seen == 0)),
              "seen_1_to_5": float(np.mean((seen >= 1) & (seen <= 5))),
              "examples_with_an_unseen_id": float(np.mean(rarest == 0)),
              "examples_with_an_id_seen_at_most_5": float(np.mean(rarest <= 5))}
    print(f"held-out ids never seen in training: {report['never_seen']:.2%} of "
          f"(example, field) pairs; seen 1-5 times: {report['seen_1_to_5']:.2%}; "
          f"examples with an unseen id: {report['examples_with_an_unseen_id']:.2%}, with "
          f"an id seen <= 5 times: {report['examples_with_an_id_seen_at_most_5']:.2%}")
    for name, mask in (("rarest id unseen", rarest == 0),
                       ("rarest id seen 1-5", (rarest >= 1) & (rarest <= 5)),
                       ("rarest id seen 6-50", (rarest > 5) & (rarest <= 50)),
                       ("every id seen > 50", rarest > 50)):
        if mask.sum() > 100:
            a = ctr_data.auc(ev["labels"][mask], ev["probs"][mask])
            b = ctr_data.auc(ev["labels"][mask], ev["true_probs"][mask])
            print(f"  {name:>20}: {mask.mean():6.2%} of held-out examples, AUC {a:.4f} "
                  f"Bayes {b:.4f} gap {b - a:.4f}")
    return report


def main() -> int:
    args = parse_args()
    if args.rank >= 0:
        worker(args)
        return 0
    import tempfile
    import pscluster.local

    temporary = not args.out  # removed after a run that succeeds; kept to read if not
    out = args.out = args.out or tempfile.mkdtemp(prefix="ctr_")
    os.makedirs(out, exist_ok=True)
    for r in range(args.workers):  # a previous run's results in the same folder
        for name in (f"worker{r}.json", f"train_keys{r}.npz", "eval.npz"):
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
    local = None
    start = time.perf_counter()
    try:
        if not args.coordinator:
            local = pscluster.local.LocalCluster(num_shards=args.local_shards, log_dir=out)
            args.coordinator = local.coordinator
            print(f"local cluster: coordinator {local.coordinator}, shards {local.addresses}; "
                  f"logs in {out}", flush=True)
        if not pscluster.local.run_workers(__file__, sys.argv[1:], args.workers,
                                           args.coordinator, out):
            print(f"the run's logs are kept in {out}", file=sys.stderr)
            return 1
    finally:
        if local:
            local.stop()
    import ctr_data
    workers = [json.load(open(os.path.join(out, f"worker{r}.json"))) for r in range(args.workers)]
    w0 = workers[0]
    seen = seen_report(out, args.workers)
    train_seconds = max(w["train_seconds"] for w in workers)
    samples = sum(w["samples"] for w in workers) // args.epochs
    print(f"total: {sum(w['samples'] for w in workers):,} samples in {train_seconds:.1f} s of "
          f"training, {sum(w['samples'] for w in workers) / train_seconds:,.0f} samples/s; "
          f"{time.perf_counter() - start:.1f} s in all", flush=True)
    print(json.dumps({
        "example": "ctr", "workers": args.workers, "shards": len(w0["rows_per_shard"]),
        "key_space": ctr_data.Model(args.seed).key_space,
        "rows_materialised": sum(w0["rows_per_shard"]),
        "rows_per_shard": w0["rows_per_shard"],
        "train_samples": samples, "epochs": args.epochs, "batch_size": args.batch_size,
        "consistency": args.consistency,
        "auc": round(w0["auc"], 5), "bayes_auc": round(w0["bayes_auc"], 5),
        "gap": round(w0["bayes_auc"] - w0["auc"], 5),
        "heldout_ids_never_seen": round(seen["never_seen"], 5),
        "heldout_examples_with_id_seen_at_most_5": round(
            seen["examples_with_an_id_seen_at_most_5"], 5),
        "samples_per_sec": round(sum(w["samples"] for w in workers) / train_seconds, 1),
        "train_seconds": round(train_seconds, 2)}))
    if temporary:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
