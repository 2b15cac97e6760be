"""psctl plan end to end: the exercise's table and --json (parsed back strictly: no NaN or
Infinity), and input that describes no job refused with exit code 2 naming the flag."""
import json
import os
import subprocess
import unittest

PSCTL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "psctl")
EXERCISE = ["--params=13e9", "--dataset_bytes=200e9", "--bytes_per_token=4", "--nodes=4",
            "--gpus_per_node=8", "--gpu=a100-80gb", "--inter_node_gbit=200", "--mfu_low=0.4",
            "--mfu_high=0.5"]


def psctl(*args):
    return subprocess.run([PSCTL, "plan", *args], capture_output=True, text=True, timeout=60)


def strict(constant):
    raise ValueError(f"not JSON: {constant}")


class PlanCliTest(unittest.TestCase):
    def test_json_parses_and_holds_the_exercises_figures(self):
        run = psctl(*EXERCISE, "--json")
        self.assertEqual(run.returncode, 0, run.stderr)
        plan = json.loads(run.stdout, parse_constant=strict)
        self.assertEqual(plan["model"]["params"], 13e9)
        self.assertEqual(plan["data"]["total_tokens"], 50e9)
        self.assertAlmostEqual(plan["compute"]["flops"], 6 * 13e9 * 50e9, delta=1e9)
        days = plan["compute"]["total_seconds_mfu_high"] / 86400
        self.assertAlmostEqual(days, 3.9e21 / (32 * 312e12 * 0.5) / 86400, places=6)
        layouts = {l["name"]: l for l in plan["layouts"]}
        self.assertEqual(layouts["DDP"]["fits"], "no")
        self.assertEqual(layouts["ZeRO-3/FSDP"]["fits"], "yes")
        self.assertEqual(layouts["ZeRO-3/FSDP"]["model_state_bytes"], 208e9 / 32)
        self.assertIn(plan["recommended"], layouts)
        self.assertIsNotNone(layouts[plan["recommended"]]["communication"])

    def test_table_is_the_default(self):
        run = psctl(*EXERCISE)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("6. Checkpoints", run.stdout)
        self.assertIn("3.90e+21 FLOP", run.stdout)

    def test_invalid_input_is_a_usage_error_naming_the_flag(self):
        for flag, args in [("--nodes", ["--nodes=0"]), ("--heads", ["--layers=12", "--width=768",
                                                                     "--heads=7", "--params=0"]),
                           ("--dataset_bytes", ["--dataset_bytes=-1"])]:
            run = psctl(*EXERCISE, *args)
            self.assertEqual(run.returncode, 2, flag)
            self.assertIn(flag, run.stderr)
            self.assertEqual(run.stdout, "")

    def test_needs_no_coordinator(self):
        run = psctl("--params=125e6", "--dataset_tokens=1e9", "--nodes=1")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("Recommended layout: DDP", run.stdout)


if __name__ == "__main__":
    unittest.main()
