"""A stand-in for ``flwr-clientapp`` in ``test_flower_preload.py``: reports what it was
started with, or waits for a signal, as its command line says."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

STARTS = 0  # module state: a fresh process must see 0 before its own start


def main() -> int:
    global STARTS
    STARTS += 1
    mode = sys.argv[1]
    if mode == "report":
        report = {
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "marker": os.environ.get("PRELOAD_TEST_MARKER"),
            "pid": os.getpid(),
            "starts": STARTS,
        }
        print(json.dumps(report), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        return int(sys.argv[2])
    if mode == "wait":

        def stop(number, frame):
            print(f"got signal {number}", flush=True)
            sys.exit(7)

        signal.signal(signal.SIGTERM, stop)
        print("waiting", flush=True)
        time.sleep(60)
        return 0
    if mode == "report-pid-and-wait":
        print(os.getpid(), flush=True)
        time.sleep(60)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")
