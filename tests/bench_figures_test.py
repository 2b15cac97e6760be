"""bench/figures.py: records in, the README's table out, and --check failing on drift.

Runs against a README and a records folder of its own (PSCLUSTER_FIGURES_README,
PSCLUSTER_FIGURES), then checks the real bench/README.md against bench/figures/.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "figures.py")
README = "# Benchmarks\n\nintro\n\n<!-- figures:begin -->\nstale\n<!-- figures:end -->\n\nafter\n"


class FiguresTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.figures = os.path.join(self.dir.name, "figures")
        self.readme = os.path.join(self.dir.name, "README.md")
        with open(self.readme, "w") as f:
            f.write(README)
        self.env = dict(os.environ, PSCLUSTER_FIGURES=self.figures,
                        PSCLUSTER_FIGURES_README=self.readme)

    def tearDown(self):
        self.dir.cleanup()

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], env=self.env, capture_output=True,
                              text=True, timeout=60)

    def record(self, name, order, figure):
        code = (f"import sys; sys.path.insert(0, {os.path.dirname(SCRIPT)!r}); import figures; "
                f"figures.record({name!r}, what='w {name}', command='cmd a\\ncmd b', "
                f"figure={figure!r}, beside='x | y', measured={{'r': 1.5}}, order={order})")
        done = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)

    def test_records_make_the_table_in_order_and_check_catches_drift(self):
        self.record("second", 20, "2.00x")
        self.record("first", 10, "1.00x")
        with open(os.path.join(self.figures, "first.json")) as f:
            rec = json.load(f)
        self.assertEqual(rec["measured"], {"r": 1.5})
        self.assertRegex(rec["sitting"], r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$")
        self.assertNotEqual(self.run_script("--check").returncode, 0)  # the stale table
        self.assertEqual(self.run_script().returncode, 0)
        with open(self.readme) as f:
            text = f.read()
        self.assertTrue(text.startswith("# Benchmarks\n\nintro\n"))
        self.assertTrue(text.endswith("<!-- figures:end -->\n\nafter\n"))
        self.assertNotIn("stale", text)
        rows = [l for l in text.splitlines() if l.startswith("| w ")]
        self.assertEqual(len(rows), 2)
        self.assertIn("| w first | `cmd a`; `cmd b` | 1.00x | x \\| y |", rows[0])
        self.assertIn("2.00x", rows[1])
        self.assertEqual(self.run_script("--check").returncode, 0)
        self.record("first", 10, "1.10x")  # a new sitting replaces the record
        self.assertNotEqual(self.run_script("--check").returncode, 0)

    def test_a_record_missing_a_field_is_refused_by_name(self):
        os.makedirs(self.figures)
        with open(os.path.join(self.figures, "bad.json"), "w") as f:
            json.dump({"what": "w"}, f)
        done = self.run_script()
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("bad.json lacks command", done.stderr)
        with open(self.readme) as f:
            self.assertEqual(f.read(), README)  # nothing written

    def test_the_repositorys_table_matches_its_records(self):
        done = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)


if __name__ == "__main__":
    unittest.main()
