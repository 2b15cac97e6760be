"""The table of an interleaved on/off training comparison (bench/metrics_cost.sh,
bench/tls_cost.sh): each round's runs are TMP/<mode>-off<round> and TMP/<mode>-on<round>,
each with deploy/local_cluster.sh's summary.json.

    python3 bench/ab_summary.py TMP ROUNDS OFF_LABEL ON_LABEL MODE...

One row per mode: the medians of samples/s and the median of the per-round on/off ratios.
"""
import json
import statistics
import sys


def main(tmp, rounds, off_label, on_label, modes):
    med = statistics.median

    def sps(mode, side, r):
        with open(f"{tmp}/{mode}-{side}{r}/summary.json") as f:
            return json.load(f)["samples_per_sec"]

    print(f"| mode | {off_label} samples/s | {on_label} samples/s | **on/off** (median of rounds) |")
    print("|---|---|---|---|")
    for mode in modes:
        off = [sps(mode, "off", r) for r in range(rounds)]
        on = [sps(mode, "on", r) for r in range(rounds)]
        print(f"| {mode} | {med(off):,.0f} | {med(on):,.0f} | "
              f"**{med(a / b for a, b in zip(on, off)):.3f}** |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
