"""What every rank process shares with its launcher (`allreduce_rank`, `ddp_rank`): the arguments that
place it (rank, hosts, namespace, rendezvous store), one JSON object per stdout line, and leaving
through its own cleanup when the launcher ends it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any


def say(doc: dict[str, Any]) -> None:
    """One answer to the launcher: a JSON object on its own line, flushed."""
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def rank_parser(prog: str, prefix: str) -> argparse.ArgumentParser:
    """The arguments common to rank processes; the caller adds its own."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--hosts", required=True, help="every rank's host, comma-separated (rank i on the i-th)")
    ap.add_argument("--ns", required=True, help="this rank's host namespace (its mrcd)")
    ap.add_argument("--store", required=True, help="the launcher's rendezvous store")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--prefix", default=prefix)
    return ap


def leave_on_sigterm() -> None:
    """The launcher ends a rank by PID with SIGTERM: exit through the caller's `finally` (QPs destroyed).
    Ctrl-C goes to the launcher, which ends the ranks."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
