#!/usr/bin/python3
"""The benchmarks' current figures: one JSON record per benchmark in bench/figures/, and
bench/README.md's table of current figures made from them.

A benchmark script ends by calling record() with its medians; its record replaces the
one before it. `bench/figures.py` rewrites the table between the README's markers;
`bench/figures.py --check` exits 1 when the table differs from the records (tests/run.sh
runs it), so the README cannot drift from the runs.

A record holds: what is measured, the command that measures it, the figure and what it
stands beside (a baseline or a ceiling of the same sitting), when and where it ran, the
raw medians (`measured`), and `history` (the sitting's notes in bench/history/, if any).
Records of sittings before this script existed were copied from their history files by
hand; they say so (`"transcribed": true`) and the table marks them.
"""
import datetime
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = os.environ.get("PSCLUSTER_FIGURES", os.path.join(HERE, "figures"))
README = os.environ.get("PSCLUSTER_FIGURES_README", os.path.join(HERE, "README.md"))
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
REQUIRED = ("what", "command", "figure", "beside", "sitting", "order")


def _machine():
    with open("/proc/meminfo") as f:
        kib = int(f.readline().split()[1])
    return f"{os.cpu_count()} cores, {kib / 2**20:.0f} GiB"


def _revision():
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def record(name, *, what, command, figure, beside, measured, order, history=""):
    """Writes bench/figures/<name>.json for this sitting (now, this machine, this revision)."""
    rec = dict(what=what, command=command, figure=figure, beside=beside, order=order,
               sitting=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               machine=_machine(), revision=_revision(), history=history, measured=measured)
    os.makedirs(FIGURES, exist_ok=True)
    path = os.path.join(FIGURES, name + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"figures: wrote {path}; run bench/figures.py to put it in bench/README.md")


def load():
    recs = []
    for path in sorted(glob.glob(os.path.join(FIGURES, "*.json"))):
        with open(path) as f:
            rec = json.load(f)
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            sys.exit(f"figures: {path} lacks {', '.join(missing)}")
        recs.append(rec)
    return sorted(recs, key=lambda r: (r["order"], r["what"]))


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(recs):
    lines = ["| what | command | figure | beside (baseline or ceiling) | sitting |",
             "|---|---|---|---|---|"]
    for r in recs:
        sitting = r["sitting"]
        if r.get("history"):
            sitting = f"[{sitting}]({os.path.relpath(r['history'], 'bench')})"
        if r.get("transcribed"):
            sitting += " (copied from its history)"
        commands = "; ".join(f"`{c}`" for c in r["command"].split("\n"))
        lines.append("| " + " | ".join(_cell(x) for x in
                                        (r["what"], commands, r["figure"], r["beside"], sitting))
                     + " |")
    return "\n".join(lines) + "\n"


def render(readme, recs):
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return (head + BEGIN + "\n<!-- made by bench/figures.py from bench/figures/*.json: "
            "edit those, not this -->\n" + table(recs) + END + tail)


def main(argv):
    with open(README) as f:
        readme = f.read()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"figures: {README} has no {BEGIN} ... {END} markers")
    recs = load()
    new = render(readme, recs)
    if argv[1:] == ["--check"]:
        if new != readme:
            sys.exit("figures: bench/README.md's table differs from bench/figures/*.json; "
                     "run bench/figures.py and commit the result")
        print(f"figures: bench/README.md's table matches bench/figures/ ({len(recs)} records)")
        return
    if argv[1:]:
        sys.exit("usage: bench/figures.py [--check]")
    with open(README, "w") as f:
        f.write(new)
    print(f"figures: rewrote the table in {README}")


if __name__ == "__main__":
    main(sys.argv)
