"""Fits beside busy processes: the library's thread choice against torch's default threads.

Small torch kernels run over several OpenMP threads stall when other
work shares the cores. ``fednovelty.runtime.threads`` runs every client step, server step and
scoring call with a thread count chosen from the size of its work; this script measures what
that choice buys, in two sections.

``kernels`` (the measurement behind ``threads.PARALLEL_WORK``)
    One E-step (``e_step_stats``, full covariances), one client k-means (``kmeans``) and
    scoring (``score_samples``) at growing sizes, work = rows x K x d^2, with one thread and
    with torch's default count, interleaved. Alone: best of the repeats (the closest this
    shared machine gets to free cores) and median; loaded: the same beside the busy processes.
``fits``
    Every fit of the demo (``fednovelty.demo.run_demo``: FedGenGMM, DEM-kmeans, FedGMM,
    Local, CentralGMM, IForest; 10_cover on ``--max-train`` training rows, 20 clients, K = 15)
    and of ``python -m benchmarks.fedgmm_pfl --quick``'s PFL experiment (Local, FedAvg, FedProx,
    FedEM, FedGMM; 8 clients, 5 rounds, seed 0), each alone and at once beside the busy
    processes, in three modes (``--modes``): ``library``, the library's choice
    (``FEDNOVELTY_NUM_THREADS`` unset: "auto"); ``default``, torch's default count in every
    step (``FEDNOVELTY_NUM_THREADS`` = that count: as if nothing chose); ``one``, one
    thread for everything, the caller's own count included (as ``OMP_NUM_THREADS=1``: the
    floor, the share of the cores that any one-thread program loses to the load). The
    caller's own torch thread count is torch's default in the first two.

The load: ``--busy`` (2) processes started by this script, each running float32 matrix products
(512 x 512) in a loop on 2 torch threads, stopped at the end. Other jobs on a shared machine
add to it; the load average is printed before and after each section.

Run (leave ``OMP_NUM_THREADS`` unset, the script sets threads; 40 minutes on the shared 2-core
machine, most of it torch's default threads beside the load; ``--section fits`` 15-20)::

    .venv/bin/python -m benchmarks.bench_threads --out benchmarks/results/threads.txt
    .venv/bin/python -m benchmarks.bench_threads --quick     # smoke run, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import torch

from benchmarks.common import add_out, add_quick, command_line, emit_report, machine_facts
from fednovelty.mixture import MixtureParams, e_step_stats, kmeans, score_samples
from fednovelty.mixture.em import moment_shift
from fednovelty.runtime.threads import ENV_VAR, PARALLEL_WORK

#: a busy process: 2 torch threads multiplying matrices until it is stopped.
BUSY_CODE = """
import torch
torch.set_num_threads({threads})
a = torch.randn(512, 512)
b = torch.randn(512, 512) / 23.0
while True:
    a = torch.tanh(a @ b)
"""
#: (n_rows, K, d) of the kernel section; work = n_rows * K * d^2. K = 15, d = 10: the demo's
#: mixtures; K = 3, d = 32: fedgmm_pfl's.
KERNEL_SIZES = (
    (1_000, 15, 10),
    (10_000, 15, 10),
    (100_000, 15, 10),
    (1_000_000, 15, 10),
    (1_000, 3, 32),
    (10_000, 3, 32),
    (100_000, 3, 32),
)
QUICK_KERNEL_SIZES = ((200, 3, 4),)
#: k-means (a client's local clustering) runs on one client's rows: sizes up to this many.
KMEANS_MAX_ROWS = 10_000
#: the fits' thread modes: the library's choice; torch's default count in every step (as if
#: nothing chose); one thread for everything, the caller's setting included
#: (OMP_NUM_THREADS=1: the floor, what any one-thread program loses to the load).
MODES = ("library", "default", "one")


# ----------------------------------------------------------------------------- load
@contextlib.contextmanager
def busy_processes(n: int, threads: int = 2) -> Iterator[list[subprocess.Popen]]:
    """``n`` processes multiplying matrices on ``threads`` torch threads each, for the body.

    Waits a second for them to start computing; terminates (then kills) them on exit.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    code = BUSY_CODE.format(threads=threads)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0.0)
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def thread_mode(mode: str, default_threads: int) -> Iterator[None]:
    """``library``: ``FEDNOVELTY_NUM_THREADS`` unset ("auto"); ``default``: set to
    ``default_threads`` (every step on torch's default count); ``one``: set to 1 and the
    caller's own count to 1. The variable and the caller's count are restored on exit."""
    before, caller = os.environ.get(ENV_VAR), torch.get_num_threads()
    if mode == "library":
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = str(1 if mode == "one" else default_threads)
    if mode == "one":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(caller)
        if before is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = before


def load_line() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------- kernels
def kernel_inputs(n_rows: int, k: int, d: int):
    """Rows (n_rows, d) and a full-covariance mixture of ``k`` unit Gaussians, float64."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n_rows, d, generator=g, dtype=torch.float64)
    means = torch.randn(k, d, generator=g, dtype=torch.float64)
    precisions_chol = torch.eye(d, dtype=torch.float64).expand(k, d, d).clone()
    weights = torch.full((k,), 1.0 / k, dtype=torch.float64)
    return X, MixtureParams(weights, means, precisions_chol, "full")


def kernels(X, params: MixtureParams) -> dict[str, Callable[[], object]]:
    k = params.n_components
    shift = moment_shift(params)
    log_w = params.weights.log()
    runs = {
        "E-step": lambda: e_step_stats(
            X, log_w, params.means, params.precisions_cholesky, "full", shift
        ),
        "k-means": lambda: kmeans(X, k, generator=torch.Generator().manual_seed(0)),
        "score": lambda: score_samples(params, X),
    }
    if X.shape[0] > KMEANS_MAX_ROWS:
        del runs["k-means"]
    return runs


def time_interleaved(
    run: Callable[[], object], counts: tuple[int, ...], repeats: int, budget_s: float
) -> dict[int, list[float]]:
    """Seconds of ``run`` per thread count, the counts alternating; at most ``repeats``
    rounds, fewer once ``budget_s`` is spent (at least one)."""
    times: dict[int, list[float]] = {n: [] for n in counts}
    started = time.perf_counter()
    for _ in range(repeats):
        for n in counts:
            torch.set_num_threads(n)
            tic = time.perf_counter()
            run()
            times[n].append(time.perf_counter() - tic)
        if time.perf_counter() - started > budget_s:
            break
    return times


def kernel_section(sizes, default_threads: int, busy: int, repeats: int, budget_s: float):
    """Rows of the kernel table: (kernel, n, K, d, work, condition, times by count)."""
    rows = []
    caller = torch.get_num_threads()
    counts = (1, default_threads)
    try:
        for condition, n_busy in (("alone", 0), ("loaded", busy)):
            print(f"kernels, {condition} ({load_line()})", flush=True)
            with busy_processes(n_busy):
                for n_rows, k, d in sizes:
                    X, params = kernel_inputs(n_rows, k, d)
                    for name, run in kernels(X, params).items():
                        run()  # warm-up (allocations, workspace)
                        times = time_interleaved(run, counts, repeats, budget_s)
                        rows.append((name, n_rows, k, d, n_rows * k * d * d, condition, times))
                        print("  " + kernel_row(rows[-1], counts), flush=True)
    finally:
        torch.set_num_threads(caller)
    return rows


def kernel_row(row, counts: tuple[int, int]) -> str:
    name, n_rows, k, d, work, condition, times = row
    one, many = times[counts[0]], times[counts[1]]
    ratio = statistics.median(many) / statistics.median(one)
    return (
        f"{name:8s} {n_rows:>8,d} {k:>3d} {d:>3d} {work:>9.1e} {condition:7s}"
        f" {min(one) * 1e3:>9.2f} {statistics.median(one) * 1e3:>9.2f}"
        f" {min(many) * 1e3:>9.2f} {statistics.median(many) * 1e3:>9.2f} {ratio:>8.2f}"
    )


def kernel_table(rows, default_threads: int) -> str:
    n = default_threads
    header = (
        f"{'kernel':8s} {'rows':>8s} {'K':>3s} {'d':>3s} {'work':>9s} {'':7s}"
        f" {'1t best':>9s} {'1t med':>9s} {f'{n}t best':>9s} {f'{n}t med':>9s} {f'{n}t/1t':>8s}"
    )
    lines = [header] + [kernel_row(row, (1, n)) for row in rows]
    return "\n".join(lines) + (
        f"\n(milliseconds; {n}t/1t = median with {n} threads / median with 1; < 1: more "
        f"threads gain; threads.PARALLEL_WORK = {PARALLEL_WORK:.0e})"
    )


# ----------------------------------------------------------------------------- fits
def demo_fits(max_train: int, n_clients: int, n_components: int) -> dict[str, float]:
    """Fit seconds of every demo method (``run_demo``) on 10_cover."""
    from fednovelty.demo import run_demo

    table = run_demo(
        "10_cover",
        n_clients=n_clients,
        n_components=n_components,
        max_train=max_train,
        progress=False,
    )
    return {f"demo: {row['method']}": float(row["fit s"]) for _, row in table.iterrows()}


def pfl_fits(n_clients: int, rounds: int) -> dict[str, float]:
    """Fit seconds of every method of ``fedgmm_pfl.py``'s PFL experiment (seed 0)."""
    from benchmarks import fedgmm_pfl
    from fednovelty.datasets.synthetic import make_fedgmm_synthetic

    settings = fedgmm_pfl.Settings(n_clients=n_clients, max_iter=rounds, seeds=(0,))
    data = make_fedgmm_synthetic(n_clients, random_state=0)
    results = fedgmm_pfl.run_pfl_seed(data, settings, 0)
    return {f"pfl: {name}": float(result["seconds"]) for name, result in results.items()}


def fit_section(
    suites, default_threads: int, busy: int, modes=MODES, warmup=()
) -> dict[tuple[str, str], dict]:
    """Seconds by (condition, mode) and method. For each suite and mode the suite runs
    alone, then at once beside the load (back to back, so that other jobs' load changes
    little between the two). ``warmup`` suites run first, untimed (first-call costs)."""
    seconds: dict[tuple[str, str], dict[str, float]] = {}
    torch.set_num_threads(default_threads)  # the caller's setting: torch's default
    for suite in warmup:
        suite()
    for suite in suites:
        for mode in modes:
            for condition, n_busy in (("alone", 0), ("loaded", busy)):
                with busy_processes(n_busy), thread_mode(mode, default_threads):
                    before = load_line()
                    caller = torch.get_num_threads()
                    found = suite()
                    if torch.get_num_threads() != caller:
                        raise RuntimeError("a fit changed the caller's torch thread count")
                seconds.setdefault((condition, mode), {}).update(found)
                print(f"  {condition} / {mode} ({before} before):", flush=True)
                for name, s in found.items():
                    print(f"    {name:40s} {s:8.1f} s", flush=True)
    return seconds


def fit_table(seconds: dict[tuple[str, str], dict], default_threads: int) -> str:
    """Method | per mode: alone s, loaded s, loaded/alone; then totals per mode."""
    modes = [mode for mode in MODES if ("alone", mode) in seconds]
    titles = {"library": "library", "default": f"default ({default_threads}t)", "one": "one"}
    header = f"{'method':42s}" + "".join(
        f" | {titles[m] + ': alone s':>20s} {'loaded s':>9s} {'loaded/alone':>12s}" for m in modes
    )
    lines = [header, "-" * len(header)]
    for method in seconds[("alone", modes[0])]:
        cells = []
        for mode in modes:
            alone = seconds[("alone", mode)][method]
            loaded = seconds[("loaded", mode)][method]
            cells.append(f"{alone:>20.1f} {loaded:>9.1f} {loaded / max(alone, 1e-9):>11.1f}x")
        lines.append(f"{method:42s} | " + " | ".join(cells))
    for mode in modes:
        alone = sum(seconds[("alone", mode)].values())
        loaded = sum(seconds[("loaded", mode)].values())
        lines.append(
            f"total, {titles[mode]}: alone {alone:.1f} s, loaded {loaded:.1f} s, "
            f"loaded/alone {loaded / max(alone, 1e-9):.1f}x"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=("kernels", "fits", "all"), default="all")
    add_quick(parser, "tiny sizes (smoke run)")
    parser.add_argument("--max-train", type=int, default=50_000, help="demo training rows")
    parser.add_argument("--busy", type=int, default=2, help="busy processes (2)")
    parser.add_argument(
        "--default-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch's default thread count (os.cpu_count())",
    )
    parser.add_argument("--repeats", type=int, default=3, help="kernel repeats (3)")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="thread modes of the fits: library (auto), default (torch's count in every "
        "step), one (one thread for everything)",
    )
    add_out(parser, "also write the report here")
    args = parser.parse_args(argv)
    for name in ("max_train", "default_threads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.busy < 0:
        parser.error("--busy must be >= 0")
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    caller = torch.get_num_threads()
    started = time.perf_counter()
    command = command_line("bench_threads", argv)
    sections = [
        "# Threads under load",
        f"command: {command.strip()}",
        f"machine: {machine_facts()}",
        f"torch default threads: {args.default_threads}; busy processes: {args.busy} x 2 "
        "threads (float32 512x512 products); other jobs on this shared machine add to the load.",
    ]
    try:
        if args.section in ("kernels", "all"):
            sizes = QUICK_KERNEL_SIZES if args.quick else KERNEL_SIZES
            repeats, budget = (2, 1.0) if args.quick else (args.repeats, 10.0)
            rows = kernel_section(sizes, args.default_threads, args.busy, repeats, budget)
            sections += ["## Kernels: one thread vs all", kernel_table(rows, args.default_threads)]
        if args.section in ("fits", "all"):
            quick = [lambda: demo_fits(min(args.max_train, 2_000), 3, 2), lambda: pfl_fits(3, 1)]
            if args.quick:
                suites, warmup = quick, ()
                what = "demo: 2,000 training rows, 3 clients, K = 2; pfl: 3 clients, 1 round"
            else:
                suites = [lambda: demo_fits(args.max_train, 20, 15), lambda: pfl_fits(8, 5)]
                warmup = quick
                what = (
                    f"demo: 10_cover, {args.max_train:,} training rows, 20 clients, K = 15; "
                    "pfl: fedgmm_pfl.py --quick (8 clients, 5 rounds, seed 0)"
                )
            print(f"fits ({load_line()})", flush=True)
            seconds = fit_section(
                suites, args.default_threads, args.busy, tuple(args.modes), warmup
            )
            sections += [f"## Fits ({what})", fit_table(seconds, args.default_threads)]
    finally:
        torch.set_num_threads(caller)
    sections.append(
        f"total runtime {(time.perf_counter() - started) / 60:.1f} min; at the end {load_line()}"
    )
    report = "\n\n".join(sections) + "\n"
    return emit_report(report, args.out)


if __name__ == "__main__":
    main()
