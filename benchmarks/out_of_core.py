"""Rows larger than memory: the registry's DEM-kmeans fitted and scored from a memory-mapped
``.npy`` file, beside the in-memory fit of the same rows.

Data: ``n`` rows x 32 features, float64, drawn from 8 Gaussians (seeded), written once in
chunks to ``.npy`` files under ``benchmarks/results/out_of_core_data/`` (git-ignored; the
20,000,000-row file is 5.1 GB). One client (``groups=None``).

Each cell runs in a fresh subprocess (``--worker``) that fits
``get_method("DEM-kmeans").build(random_state=0, max_iter=3)`` (8 full-covariance components,
standardised rows, k-FED seeds and Lloyd rounds, then ``max_iter`` EM rounds: a few, so that
the 20M-row cell takes minutes; the per-row speed of an EM round does not depend on how
many run) and scores every row with ``score_samples``. The rows are given

- ``memory``: as an ndarray read fully into memory first (``np.load``), the in-memory path;
- ``stream``: as the memory map (``np.load(path, mmap_mode="r")``), read chunk by chunk
  (``docs/scaling.md``).

Per cell: seconds to fit and to score, microseconds per row of each, and the process's peak
resident memory (``VmHWM`` of the worker, from its start: the interpreter, torch and every
buffer; a memory map's pages are handed back after each chunk, so they do not count). The
report gives, from one run, the stream path's per-row times as ratios to the in-memory path
on the set that fits (2,000,000 rows; the in-memory path holds the rows and their copies),
and the 20,000,000-row stream cell's peak memory against the 1.5 GB target.

Cells are kept as JSON under ``benchmarks/results/out_of_core_cells/`` (a rerun skips the
finished ones; ``--fresh`` runs them again). Run in the background::

    OMP_NUM_THREADS=1 nohup .venv/bin/python -u -m benchmarks.out_of_core &

Options: ``--sizes`` (rows of the stream cells; the first is also fitted in memory,
``--repeats`` runs of each, alternating, default 2), ``--max-iter``, ``--threads`` (torch
threads per cell, default 1: one thread is least disturbed by other work on the machine),
``--data DIR``, ``--out FILE`` (default ``benchmarks/results/out_of_core.md``), ``--quick``
(6,000 rows in memory and streamed, one EM round, in a temporary folder, no report file:
the smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
N_FEATURES = 32
N_BLOBS = 8
WRITE_ROWS = 1_000_000
#: peak resident memory the 20,000,000-row stream cell must stay under.
TARGET_BYTES = 1.5e9


def write_rows(path: Path, n_rows: int, seed: int = 0) -> None:
    """``n_rows`` x ``N_FEATURES`` float64 rows of ``N_BLOBS`` Gaussians, written to the
    ``.npy`` file ``path`` in chunks (never all in memory); kept when it exists."""
    if path.exists():
        return
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, (N_BLOBS, N_FEATURES))
    scales = rng.uniform(0.5, 2.0, N_BLOBS)
    partial = path.with_suffix(".partial.npy")
    out = np.lib.format.open_memmap(
        partial, mode="w+", dtype=np.float64, shape=(n_rows, N_FEATURES)
    )
    for start in range(0, n_rows, WRITE_ROWS):
        m = min(WRITE_ROWS, n_rows - start)
        blob = rng.integers(0, N_BLOBS, m)
        out[start : start + m] = centres[blob] + scales[blob, None] * rng.normal(
            size=(m, N_FEATURES)
        )
    out.flush()
    del out
    partial.rename(path)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def worker(path: str, mode: str, max_iter: int) -> dict:
    """One cell in this (fresh) process: fit and score the rows of ``path`` given as
    ``mode`` (``memory`` or ``stream``); times, peak memory and the fit's record."""
    import torch

    from fednovelty.methods import get_method

    rows = np.load(path) if mode == "memory" else np.load(path, mmap_mode="r")
    detector = get_method("DEM-kmeans").build(random_state=0, max_iter=max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter rounds: no convergence, by design
        start = time.perf_counter()
        detector.fit(rows)
        fitted = time.perf_counter()
        scores = detector.score_samples(rows)
        scored = time.perf_counter()
    return {
        "mode": mode,
        "n_rows": int(rows.shape[0]),
        "fit_s": fitted - start,
        "score_s": scored - fitted,
        "peak_bytes": _status_bytes("VmHWM"),
        "n_rounds": int(detector.n_rounds_),
        "n_iter": int(detector.n_iter_),
        "mean_log_px": float(scores.mean()),
        "threads": torch.get_num_threads(),
    }


def run_cell(
    path: Path, mode: str, max_iter: int, threads: int, cells: Path, fresh: bool, run: int = 0
) -> dict:
    """The cell's result (its ``run``-th repetition): kept from an earlier run (``cells``),
    or run in a fresh process."""
    kept = cells / f"{path.stem}-{mode}-{max_iter}-t{threads}-r{run}.json"
    if kept.exists() and not fresh:
        return json.loads(kept.read_text())
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "FEDNOVELTY_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "benchmarks.out_of_core", "--worker", str(path), mode]
    command += ["--max-iter", str(max_iter)]
    print(f"  {path.name} {mode} (run {run}) ...", flush=True)
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(f"cell {path.name} {mode} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load_after"] = os.getloadavg()[0]
    cells.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(result, indent=1))
    print(f"    fit {result['fit_s']:.1f} s, score {result['score_s']:.1f} s, peak "
          f"{result['peak_bytes'] / 1e9:.2f} GB", flush=True)  # fmt: skip
    return result


def best(runs: list[dict]) -> list[dict]:
    """One row per (rows, mode) in first-seen order: the fastest fit and score of its runs
    and the highest peak, with how many runs."""
    cells: dict[tuple, dict] = {}
    for r in runs:
        key = (r["n_rows"], r["mode"])
        if key not in cells:
            cells[key] = {**r, "runs": 0}
        cell = cells[key]
        cell["runs"] += 1
        cell["fit_s"], cell["score_s"] = (
            min(cell["fit_s"], r["fit_s"]),
            min(cell["score_s"], r["score_s"]),
        )
        cell["peak_bytes"] = max(cell["peak_bytes"], r["peak_bytes"])
    return list(cells.values())


def report(runs: list[dict], max_iter: int, threads: int, seconds: float) -> str:
    """The markdown report: one row a cell (best of its runs), per-row times and their
    ratios to the in-memory cell, peak memory against the target."""
    from benchmarks.common import machine_facts

    results = best(runs)
    memory = next(r for r in results if r["mode"] == "memory")
    per_row = {k: memory[f"{k}_s"] / memory["n_rows"] for k in ("fit", "score")}
    lines = [
        "# Rows larger than memory: DEM-kmeans from a memory map",
        "",
        f"- command: `python -m benchmarks.out_of_core {' '.join(sys.argv[1:])}`",
        f"- {time.strftime('%Y-%m-%d')}; {machine_facts()}; {threads} thread(s) per cell",
        f"- fit: the registry's DEM-kmeans, K = 8 full, standardised, k-FED + Lloyd start, "
        f"max_iter = {max_iter} EM rounds; then `score_samples` of every row; one client",
        f"- rows: float64, {N_FEATURES} features, {N_BLOBS} Gaussians; peak = the worker "
        "process's VmHWM (interpreter and torch included)",
        f"- total {seconds / 60:.1f} min; load average at the end {os.getloadavg()[0]:.1f}",
        "",
        "Times are the best of the cell's runs (memory and stream runs alternate); peak the "
        "highest.",
        "",
        "| rows | rows given as | runs | fit s | fit us/row (x memory) | score s | "
        "score us/row (x memory) | rounds | peak GB | data GB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        n = r["n_rows"]
        fit_us, score_us = 1e6 * r["fit_s"] / n, 1e6 * r["score_s"] / n
        lines.append(
            f"| {n:,} | {r['mode']} | {r['runs']} | {r['fit_s']:.1f} | {fit_us:.2f} "
            f"({r['fit_s'] / n / per_row['fit']:.2f}x) | {r['score_s']:.1f} | {score_us:.3f} "
            f"({r['score_s'] / n / per_row['score']:.2f}x) | {r['n_rounds']} | "
            f"{r['peak_bytes'] / 1e9:.2f} | {n * N_FEATURES * 8 / 1e9:.2f} |"
        )
    largest = max((r for r in results if r["mode"] == "stream"), key=lambda r: r["n_rows"])
    verdict = "under" if largest["peak_bytes"] < TARGET_BYTES else "OVER"
    lines += [
        "",
        f"Peak memory of the {largest['n_rows']:,}-row stream cell: "
        f"{largest['peak_bytes'] / 1e9:.2f} GB, {verdict} the {TARGET_BYTES / 1e9:.1f} GB target "
        f"(its rows: {largest['n_rows'] * N_FEATURES * 8 / 1e9:.1f} GB).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 20_000_000])
    parser.add_argument("--max-iter", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each smallest-size cell")
    parser.add_argument("--data", type=Path, default=RESULTS / "out_of_core_data")
    parser.add_argument("--out", type=Path, default=RESULTS / "out_of_core.md")
    parser.add_argument("--fresh", action="store_true", help="run kept cells again")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sets, no report")
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(args.worker[0], args.worker[1], args.max_iter)
        print(json.dumps(result))
        return json.dumps(result)
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        data, cells, out = args.data, RESULTS / "out_of_core_cells", args.out
        sizes, max_iter = args.sizes, args.max_iter
        if args.quick:
            data = cells = Path(scratch)
            out, sizes, max_iter, args.repeats = None, [6_000], 1, 1
        data.mkdir(parents=True, exist_ok=True)
        results = []
        for index, n in enumerate(sizes):
            path = data / f"rows_{n}.npy"
            write_rows(path, n)
            modes = ("memory", "stream") if index == 0 else ("stream",)
            for run in range(args.repeats if index == 0 else 1):
                for mode in modes:
                    cell = run_cell(path, mode, max_iter, args.threads, cells, args.fresh, run)
                    results.append(cell)
        text = report(results, max_iter, args.threads, time.time() - started)
    print(text)
    if out is not None:
        out.write_text(text)
    return text


if __name__ == "__main__":
    main()
