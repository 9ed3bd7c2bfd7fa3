"""`make demo`'s report: the two `mrcctl -j allreduce --transport mrc` documents (2-bit EDEN and
uncompressed, same testbed, same failure) -> both tables, the comparison, report.json and a PNG.

    python deploy/demo_report.py COMPRESSED.json UNCOMPRESSED.json OUTDIR [--tables]

The PNG has one column per run: per-plane throughput (bytes sent by the hosts' egress programs, summed
over hosts, sampled during the run) and the iteration times over time, the link failure shaded.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from mrc.ctl.cmd_allreduce import render


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def compare(c: dict[str, Any], u: dict[str, Any]) -> dict[str, Any]:
    def split(doc: dict[str, Any]) -> dict[str, Any]:
        ok = [r for r in doc["iterations"] if r["time_s"] is not None]
        down = [r["time_s"] for r in ok if r["failed_link_down"]]
        up = [r["time_s"] for r in ok if not r["failed_link_down"]]
        md, mu = _median(down), _median(up)
        return {"median_time_s": doc["summary"]["median_time_s"], "median_time_failure_free_s": mu,
                "median_time_link_down_s": md, "max_time_link_down_s": max(down) if down else None,
                "iterations_link_down": len(down), "iterations_failure_free": len(up),
                "link_down_over_failure_free": None if md is None or not mu else md / mu,
                "max_link_down_over_failure_free": None if not down or not mu else max(down) / mu,
                "errors": doc["summary"]["errors"], "mean_vnmse": doc["summary"]["mean_vnmse"],
                "mean_wire_bytes": doc["summary"]["mean_wire_bytes"]}

    sc, su = split(c), split(u)
    a, b = sc["median_time_failure_free_s"], su["median_time_failure_free_s"]
    return {"compressed": sc, "uncompressed": su,
            "time_ratio_compressed_over_uncompressed": None if not a or not b else a / b,
            "wire_ratio_compressed_over_uncompressed":
                None if not sc["mean_wire_bytes"] or not su["mean_wire_bytes"]
                else sc["mean_wire_bytes"] / su["mean_wire_bytes"]}


def plot(docs: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(docs), figsize=(7 * len(docs), 7), sharex="col", squeeze=False)
    for col, (title, doc) in enumerate(docs):
        top, bottom = axes[0][col], axes[1][col]
        tl = doc.get("timeline", {})
        for p, series in enumerate(tl.get("plane_tx_gbps", [])):
            top.plot(tl["t_s"], [v * 1e3 for v in series], label=f"plane {p}", lw=1.2)
        top.set_ylabel("sent per plane, all hosts (Mbit/s)")
        top.set_title(title)
        top.legend(loc="upper right", fontsize=8)
        its = tl.get("iterations", [])
        bottom.bar([i["start_s"] for i in its], [i["end_s"] - i["start_s"] for i in its],
                   width=[i["end_s"] - i["start_s"] for i in its], align="edge",
                   color=["tab:red" if i["link_down"] else "tab:blue" for i in its], alpha=0.7)
        bottom.set_ylabel("iteration time (s); red: link down during it")
        bottom.set_xlabel("time since the first measured iteration (s)")
        f = doc.get("failure")
        if f:
            for d, up in zip(f["down_s"], f["up_s"], strict=True):
                end = up if up is not None else (its[-1]["end_s"] if its else d)
                for ax in (top, bottom):
                    ax.axvspan(d, end, color="grey", alpha=0.25,
                               label=f"{f['link']} down" if ax is top else None)
            top.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    argv = [a for a in argv if a != "--tables"]
    if len(argv) != 3:
        print("usage: demo_report.py COMPRESSED.json UNCOMPRESSED.json OUTDIR", file=sys.stderr)
        return 2
    c = json.loads(Path(argv[0]).read_text())
    u = json.loads(Path(argv[1]).read_text())
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    cmp_ = compare(c, u)
    if "--tables" in sys.argv:
        print("\n== 2-bit EDEN (unbiased), partial-sum aware\n" + render(c))
        print("\n== uncompressed (float32)\n" + render(u))
    sc, su = cmp_["compressed"], cmp_["uncompressed"]

    def s(v: float | None, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    print("\n== comparison (same testbed, same link failure, one run)")
    print(f"median failure-free iteration: 2-bit EDEN {s(sc['median_time_failure_free_s'])} s, "
          f"uncompressed {s(su['median_time_failure_free_s'])} s: "
          f"ratio {s(cmp_['time_ratio_compressed_over_uncompressed'])} (target <= 0.167)")
    print(f"wire bytes per iteration: ratio {s(cmp_['wire_ratio_compressed_over_uncompressed'], '.4f')}")
    for name, x in (("2-bit EDEN", sc), ("uncompressed", su)):
        print(f"{name}: {x['iterations_link_down']} iteration(s) with the link down, median "
              f"{s(x['median_time_link_down_s'])} s, worst {s(x['max_time_link_down_s'])} s = "
              f"{s(x['max_link_down_over_failure_free'], '.2f')} x the failure-free median "
              f"(target <= 1.5); errors {x['errors']}")
    report = {"compressed": c, "uncompressed": u, "comparison": cmp_}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    plot([("2-bit EDEN, partial-sum aware", c), ("uncompressed", u)], out / "allreduce.png")
    return 0 if c["summary"]["errors"] == 0 and u["summary"]["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
