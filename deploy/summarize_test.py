"""deploy/summarize.py: the run's summary.json from the workers' own summaries."""
import json
import os
import tempfile
import unittest

from deploy import summarize


def worker_summary(rollbacks):
    return {"rank": 0, "mode": "ps", "final_mode": "ps", "steps": 100, "epochs": 1,
            "final_loss": 0.5, "test_accuracy": 0.9, "samples_per_sec": 1000.0,
            "train_seconds": 1.0, "snapshots": [], "rollbacks": rollbacks, "switches": [],
            "figures": {}, "param_crc32c": 7}


class SummarizeTest(unittest.TestCase):

    def summary(self, per_worker):
        with tempfile.TemporaryDirectory() as out:
            for r, rollbacks in enumerate(per_worker):
                with open(os.path.join(out, f"worker{r}.json"), "w") as f:
                    json.dump(worker_summary(rollbacks), f)
            return summarize.summarize(out, str(len(per_worker)), "2", "1", "bsp", "3", "ps", "4")

    # Rank 0 was killed and replaced: its replacement's file lists no rollback, rank 1's
    # lists the one the cluster took.
    def test_rollbacks_seen_by_workers_other_than_rank_0_are_listed_naming_the_worker(self):
        s = self.summary([[], [[57, 40]]])
        self.assertEqual(s["rollbacks"], [{"worker": 1, "failed_step": 57, "restored_step": 40}])

    def test_every_workers_rollbacks_are_listed_by_rank(self):
        s = self.summary([[[57, 40]], [[58, 40], [90, 80]], []])
        self.assertEqual(s["rollbacks"], [
            {"worker": 0, "failed_step": 57, "restored_step": 40},
            {"worker": 1, "failed_step": 58, "restored_step": 40},
            {"worker": 1, "failed_step": 90, "restored_step": 80},
        ])

    def test_no_rollbacks(self):
        s = self.summary([[], []])
        self.assertEqual(s["rollbacks"], [])
        self.assertEqual(s["samples_per_sec"], 2000.0)
        self.assertEqual(s["checkpoints"], [])


if __name__ == "__main__":
    unittest.main()
