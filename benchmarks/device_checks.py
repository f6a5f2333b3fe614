"""The checks to run on a GPU machine, in one command that fits a short session on it.

1. The CUDA lane (``pytest -m cuda tests/detectors/test_cuda_lane.py``): every registry method
   fitted on CUDA scores as on the CPU. Its pass, fail and skip counts and time are recorded
   (skipped as a whole where torch sees no CUDA device).
2. FedGMM at the FEMNIST paper's scale (``fedgmm_femnist.py``'s ``PAPER_SCALE``: 539 writers,
   the paper's CNN, M1 = M2 = 3, SGD at 0.001 in batches of 128, one local epoch) for
   ``--rounds`` joint rounds, the clients batched, and (``--one-by-one-rounds``) the same with
   one client at a time: seconds per joint round from the fit's round records, and the 200
   rounds they extrapolate to beside the 30-minute target (federated PCA's two rounds are
   counted once). Test accuracy (each writer's own weights) after those rounds is printed, not
   judged: a few rounds are far from the paper's 200.

Run ``python -m benchmarks.device_checks --device cuda --out report.md`` on the GPU machine;
``--quick`` (8 writers, the MLP, 1 round; the lane skipped) checks the script on a CPU. On the
GPU machine torch is preinstalled: ``python3 -m benchmarks.device_checks ...`` from the
repository root finds both ``fednovelty`` and ``benchmarks`` there.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
import time

import torch

from benchmarks.common import (
    REPO,
    add_out,
    add_quick,
    command_line,
    device_facts,
    emit_report,
    personal_accuracy,
    report_header,
    shifted_writers,
    standardised,
)
from benchmarks.fedgmm_femnist import PAPER_SCALE, Settings, make_model

#: the paper's rounds and the time they should take on one H100.
PAPER_ROUNDS, TARGET_MINUTES = 200, 30.0


def cuda_lane(timeout_s: float) -> str:
    """The lane's summary line (``N passed, M skipped in T s``) or why it did not finish."""
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    command.append(str(REPO / "tests" / "detectors" / "test_cuda_lane.py"))
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"did not finish within {timeout_s:.0f} s"
    lines = [
        line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)
    ]
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return "; ".join([*(lines[-1:] or [f"exit {done.returncode}"]), *failed[:10]])


def joint_rounds(settings: Settings, data) -> tuple[float, float, float]:
    """Fit FedGMM under ``settings``; ``(seconds of the whole fit, mean seconds of a joint
    round, test accuracy %)``."""
    model = make_model("FedGMM", settings, seed=0)
    started = time.perf_counter()
    model.fit(data.X_train, data.y_train, data.groups_train)
    if settings.device == "cuda":
        torch.cuda.synchronize()
    total = time.perf_counter() - started
    joint = [r["seconds"] for r in model.history_ if r["kind"] == "joint_em"]
    accuracy = personal_accuracy(model, data.X_test, data.y_test, data.groups_test)
    return total, sum(joint) / max(1, len(joint)), accuracy


def scale_rows(args) -> list[str]:
    if args.quick:
        base = Settings(8, 1, (0,), device=args.device)
    else:
        base = Settings(seeds=(0,), device=args.device, **{**PAPER_SCALE, "max_iter": args.rounds})
    data = standardised(shifted_writers(base.n_writers, 0))
    warm = dataclasses.replace(base, n_writers=8, max_iter=1)  # imports, kernels' first use
    joint_rounds(warm, standardised(shifted_writers(warm.n_writers, 0)))
    rows = []
    runs = [("batched", base)]
    if args.one_by_one_rounds > 0:
        one = dataclasses.replace(base, batch_clients=False, max_iter=args.one_by_one_rounds)
        runs.append(("one at a time", one))
    for name, settings in runs:
        total, per_round, accuracy = joint_rounds(settings, data)
        fixed = max(0.0, total - per_round * settings.max_iter)
        projected = (fixed + per_round * PAPER_ROUNDS) / 60
        verdict = "within" if projected <= TARGET_MINUTES else "over"
        rows.append(
            f"| {name} | {settings.max_iter} | {total:.1f} | {per_round:.2f} | {fixed:.1f} | "
            f"{projected:.1f} ({verdict} {TARGET_MINUTES:.0f}) | {accuracy:.2f} |"
        )
        print(rows[-1], flush=True)
    return [f"- scale: {base.describe()}", "", *TABLE_HEAD, *rows]


TABLE_HEAD = [
    "| clients | joint rounds | fit s | s per joint round | other s | 200 rounds, min "
    "(target) | test accuracy % |",
    "|---|---|---|---|---|---|---|",
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one-by-one-rounds", type=int, default=1)
    parser.add_argument("--lane-timeout", type=float, default=300.0)
    add_quick(parser)
    add_out(parser)
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    device = device_facts(args.device)
    command = command_line("device_checks", argv)
    started = time.perf_counter()
    lane = "skipped (--quick)" if args.quick else cuda_lane(args.lane_timeout)
    print(f"CUDA lane: {lane}", flush=True)
    rows = scale_rows(args)
    header = report_header(
        "Device checks: the CUDA lane and FedGMM at the FEMNIST paper's scale",
        command,
        args.quick,
        time.perf_counter() - started,
    )
    body = [header, f"- device: {device}", f"- CUDA lane: {lane}", *rows]
    return emit_report("\n".join(body) + "\n", args.out)


if __name__ == "__main__":
    main()
