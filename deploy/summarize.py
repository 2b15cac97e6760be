"""summary.json of a local_cluster.sh run, from every worker's --summary_json file.

    python3 deploy/summarize.py OUT WORKERS SHARDS EPOCHS CONSISTENCY WALL MODE MICRO_BATCHES [PLOTS]

Rank 0's figures stand for the run (accuracy, steps, loss, final mode and parameters);
throughput adds up over the workers. Rollbacks are every worker's: each worker lists the
rollbacks it took part in, and rank 0's file alone misses those of a run whose rank 0 was
killed (its replacement's file starts after them). PLOTS: the plots deploy/plot_run.py
wrote, one path a line (none when it failed), listed as "plots" and on the summary line.
"""
import json
import math
import os
import sys


def rollbacks(ws):
    """Every rollback any worker saw, by rank then in the order it saw them."""
    return [{"worker": r, "failed_step": f, "restored_step": t}
            for r, w in enumerate(ws) for f, t in w.get("rollbacks", [])]


def summarize(out, workers, shards, epochs, consistency, wall, mode, micro_batches, plots=()):
    ws = [json.load(open(f"{out}/worker{r}.json")) for r in range(int(workers))]
    checkpoints = f"{out}/coordinator/checkpoints.json"
    return {
        "test_accuracy": ws[0]["test_accuracy"],
        "test_loss": ws[0].get("test_loss", -1),
        "model": ws[0].get("model", "mlp"),
        "epochs": int(epochs),
        "steps": ws[0]["steps"],
        "steps_per_epoch": ws[0].get("steps_per_epoch", 0),
        "samples_per_sec": round(sum(w["samples_per_sec"] for w in ws), 1),
        "wall_seconds": int(wall),
        "checkpoints": json.load(open(checkpoints)) if os.path.exists(checkpoints) else [],
        "rollbacks": rollbacks(ws),
        "param_crc32c": ws[0].get("param_crc32c", 0),
        "workers": int(workers),
        "shards": int(shards),
        "consistency": consistency,
        "mode": mode,
        "final_mode": ws[0].get("final_mode", mode),
        "switches": [dict(s, handoff_seconds=max(w["switches"][k]["handoff_seconds"]
                                                 for w in ws if len(w.get("switches", [])) > k))
                     for k, s in enumerate(ws[0].get("switches", []))],
        "figures": {f"worker{r}": w.get("figures", {}) for r, w in enumerate(ws)},
        "micro_batches": int(micro_batches),
        "final_loss": ws[0]["final_loss"],
        "plots": list(plots),
    }


def main(argv):
    out, epochs, wall = argv[0], argv[3], argv[5]
    summary = summarize(*argv[:8], plots=argv[8].splitlines() if len(argv) > 8 else [])
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
    plots = f"; plots: {', '.join(summary['plots'])}" if summary["plots"] else ""
    # A byte-level language model's figure is its test loss in bits per byte.
    bits = (f"test loss {summary['test_loss'] / math.log(2):.4f} bits per byte, "
            if summary["model"] == "gpt" and summary["test_loss"] > 0 else "")
    # A run cut short by --max_steps says how many steps it trained.
    steps, per_epoch = summary["steps"], summary["steps_per_epoch"]
    span = (f"{steps} steps" if per_epoch and steps < int(epochs) * per_epoch
            else f"{epochs} epoch{'' if int(epochs) == 1 else 's'}")
    print(f"== {bits}test accuracy {summary['test_accuracy']:.4f} after {span} "
          f"({summary['samples_per_sec']:.0f} samples/s, {wall} s); summary: {out}/summary.json"
          f"{plots}")


if __name__ == "__main__":
    main(sys.argv[1:])
