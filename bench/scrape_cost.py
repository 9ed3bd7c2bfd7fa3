#!/usr/bin/env python3
"""What Prometheus scraping costs a bulk WRITE: `mrcctl bench write` runs alternately without and with a
scraper that GETs the source's and the destination's /metrics every `--every` seconds (as a Prometheus
server with a 100 ms scrape interval would), on one testbed, in one run, so that the ratio survives a VM
whose speed drifts between sessions.

    .venv/bin/python bench/scrape_cost.py -n NAME [--pairs 4] [--size 128M] [--every 0.1] [-j]

NAME is a testbed that is up with its daemons (`mrcctl testbed up ... --with-daemons`). Prints one row
per pair (goodput off / on, their ratio, scrapes done and their latency) and the median ratio; `-j`
prints the same as JSON. Every scrape must answer with `mrc_up 1` (a scrape that stalls the loop, or
one that the loop cannot serve, shows up as a failed or slow scrape here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from mrc.ctl import daemons
from mrc.ctl.bench import BenchConfig, WriteBench
from mrc.units import parse_size


def scrape_loop(urls: list[str], every_s: float, stop: threading.Event) -> dict[str, Any]:
    """GET every URL once per period until `stop`; latency and `mrc_up` of every answer."""
    latency: list[float] = []
    failed = down = 0
    while not stop.is_set():
        t = time.monotonic()
        for u in urls:
            t0 = time.monotonic()
            try:
                text = urllib.request.urlopen(u, timeout=5).read().decode()
            except OSError:
                failed += 1
                continue
            latency.append(time.monotonic() - t0)
            if not any(line.startswith("mrc_up{") and line.rstrip().endswith(" 1.0")
                       for line in text.splitlines()):
                down += 1
        stop.wait(max(0.0, every_s - (time.monotonic() - t)))
    return {"latency_s": latency, "failed": failed, "not_up": down}


class Scraper:
    """The scrape loop in a process of its own, as a Prometheus server is (in this process it would
    compete with the bench's client for the interpreter). Ends when its stdin closes; its result comes
    back as one JSON line."""

    def __init__(self, urls: list[str], every_s: float) -> None:
        self.cmd = [sys.executable, __file__, "--scrape-child", str(every_s), *urls]
        self.result: dict[str, Any] = {}

    def __enter__(self) -> Scraper:
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *_: object) -> None:
        try:
            out, _err = self.proc.communicate(input="", timeout=30)
            self.result = json.loads(out)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


class PrometheusScraper:
    """Debian's Prometheus server itself, scraping the URLs every `every_s` (what the issue's "a
    Prometheus scrape every 100 ms" means), on a temporary config and TSDB. Its own scrape statistics
    (`scrape_duration_seconds`, `up`) are read from its API at the end."""

    def __init__(self, urls: list[str], every_s: float) -> None:
        self.urls = urls
        self.every_s = every_s
        self.result: dict[str, Any] = {}

    def __enter__(self) -> PrometheusScraper:
        import socket as so
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="mrc-scrape-")
        targets = [u.removeprefix("http://").removesuffix("/metrics") for u in self.urls]
        ms = max(1, int(self.every_s * 1000))
        cfg = (f"global:\n  scrape_interval: {ms}ms\n  scrape_timeout: {ms}ms\n"
               f"scrape_configs:\n  - job_name: mrcd\n    static_configs:\n      - targets: {targets!r}\n")
        with open(f"{self.dir}/prometheus.yml", "w") as f:
            f.write(cfg)
        with so.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.t0 = time.time()
        self.proc = subprocess.Popen(["prometheus", f"--config.file={self.dir}/prometheus.yml",
                                      f"--storage.tsdb.path={self.dir}/tsdb",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Prometheus hands discovered targets to its scrapers ~5 s after start: wait until every target
        # has been scraped once, so the measured arm is scraped from its first moment
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if len(self._query("up")) == len(self.urls):
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        else:
            self.__exit__()
            raise SystemExit("bench/scrape_cost.py: Prometheus did not start scraping within 60 s")
        self.t0 = time.time()
        return self

    def _query(self, q: str) -> list[Any]:
        import urllib.parse

        url = f"http://127.0.0.1:{self.port}/api/v1/query?query={urllib.parse.quote(q)}"
        doc = json.loads(urllib.request.urlopen(url, timeout=5).read())
        return list(doc["data"]["result"])

    def __exit__(self, *_: object) -> None:
        import shutil

        try:
            span = max(1, int(time.time() - self.t0))
            n = self._query(f"count_over_time(scrape_duration_seconds[{span}s])")
            lat = self._query(f"quantile_over_time(0.5, scrape_duration_seconds[{span}s])")
            mx = self._query(f"max_over_time(scrape_duration_seconds[{span}s])")
            down = self._query(f"count_over_time((up == 0)[{span}s:])")
            self.result = {"latency_s": [], "scrapes": int(sum(float(r["value"][1]) for r in n)),
                           "p50_s": max((float(r["value"][1]) for r in lat), default=None),
                           "max_s": max((float(r["value"][1]) for r in mx), default=None),
                           "failed": 0, "not_up": int(sum(float(r["value"][1]) for r in down))}
        except (OSError, ValueError, KeyError):
            self.result = {"latency_s": [], "scrapes": 0, "p50_s": None, "max_s": None, "failed": -1,
                           "not_up": 0}
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.dir, ignore_errors=True)


def _child(every_s: float, urls: list[str]) -> int:
    stop = threading.Event()

    def wait_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_eof, daemon=True).start()
    print(json.dumps(scrape_loop(urls, every_s, stop)))
    return 0


def goodput(name: str, src: str, dst: str, size: int) -> float:
    doc = WriteBench(BenchConfig(name, src, dst, [size])).run()
    if not doc["bit_exact"]:
        raise SystemExit("bench/scrape_cost.py: the destination differs from the source")
    return float(doc["rows"][0]["bw_avg_gbps"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--scrape-child"]:
        return _child(float(argv[1]), argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--name", required=True, help="testbed name (up, with daemons)")
    ap.add_argument("--src", default="h0")
    ap.add_argument("--dst", default="h2")
    ap.add_argument("--size", default="128M")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--every", type=float, default=0.1, help="scrape period (seconds)")
    ap.add_argument("--scrape", default=None, metavar="HOSTS",
                    help="whose mrcds to scrape (default: SRC,DST)")
    ap.add_argument("--control", default=None, metavar="HOSTS",
                    help="also run each pair's third arm scraping these mrcds, which the WRITE does not use "
                         "(e.g. h1,h3): the same scraping work, none of it in the WRITE's daemons, so "
                         "on/control is what the scraped loops themselves lose")
    ap.add_argument("--scraper", choices=("prometheus", "python"), default=None,
                    help="who scrapes: Debian's Prometheus server (default when installed) or a Python "
                         "urllib loop in its own process")
    ap.add_argument("-j", "--json", action="store_true")
    args = ap.parse_args(argv)
    rec = daemons.records(args.name)["daemons"]
    targets = args.scrape.split(",") if args.scrape else [args.src, args.dst]
    control = args.control.split(",") if args.control else []

    def url(h: str) -> str:
        m = (rec.get(h) or {}).get("metrics")
        if not m:
            raise SystemExit(f"bench/scrape_cost.py: {h} has no mrcd with --metrics on testbed {args.name}")
        return f"http://{m}/metrics"

    urls = [url(h) for h in targets]
    control_urls = [url(h) for h in control]
    size = parse_size(args.size)
    import shutil

    kind = args.scraper or ("prometheus" if shutil.which("prometheus") else "python")
    make: Any = PrometheusScraper if kind == "prometheus" else Scraper
    rows: list[dict[str, Any]] = []
    for i in range(args.pairs):
        off = goodput(args.name, args.src, args.dst, size)
        with make(urls, args.every) as s:
            on = goodput(args.name, args.src, args.dst, size)
        ctl = None
        if control_urls:
            with make(control_urls, args.every):
                ctl = goodput(args.name, args.src, args.dst, size)
        res = s.result
        lat = sorted(res["latency_s"])
        if lat:
            res.update(scrapes=len(lat), p50_s=lat[len(lat) // 2], max_s=lat[-1])
        rows.append({"pair": i, "off_gbps": off, "on_gbps": on, "ratio": round(on / off, 4),
                     "control_gbps": ctl, "control_ratio": None if ctl is None else round(ctl / off, 4),
                     "scrapes": res["scrapes"], "failed": res["failed"], "not_up": res["not_up"],
                     "scrape_p50_ms": None if res["p50_s"] is None else round(res["p50_s"] * 1e3, 2),
                     "scrape_max_ms": None if res["max_s"] is None else round(res["max_s"] * 1e3, 2)})
    doc = {"testbed": args.name, "src": args.src, "dst": args.dst, "scraper": kind, "scraped": targets,
           "size": size,
           "every_s": args.every,
           "control": control, "rows": rows, "median_ratio": statistics.median(r["ratio"] for r in rows),
           "median_control_ratio": statistics.median(r["control_ratio"] for r in rows) if control else None}
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    print(f"{'pair':>4} {'off Gbit/s':>10} {'on Gbit/s':>10} {'on/off':>7} {'ctl/off':>7} {'scrapes':>7} "
          f"{'fail':>4} {'!up':>4} {'p50 ms':>7} {'max ms':>7}")
    for r in rows:
        cr = "-" if r["control_ratio"] is None else f"{r['control_ratio']:.3f}"
        print(f"{r['pair']:>4} {r['off_gbps']:>10.4f} {r['on_gbps']:>10.4f} {r['ratio']:>7.3f} {cr:>7} "
              f"{r['scrapes']:>7} {r['failed']:>4} {r['not_up']:>4} {r['scrape_p50_ms']!s:>7} "
              f"{r['scrape_max_ms']!s:>7}")
    print(f"median on/off: {doc['median_ratio']:.3f} ({kind} scraping {' and '.join(targets)} every "
          f"{args.every:g} s; {args.src} -> {args.dst} {args.size} WRITE)")
    if control:
        print(f"median control/off: {doc['median_control_ratio']:.3f} (scraping {' and '.join(control)}); "
              f"on/control: {doc['median_ratio'] / doc['median_control_ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
