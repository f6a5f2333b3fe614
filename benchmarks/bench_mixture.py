"""Speed and memory of fednovelty's torch mixture kernels against scikit-learn, in one run.

Run ``python -m benchmarks.bench_mixture`` (about 10 minutes on 2 cores) or ``--quick`` (a
smoke run, under a minute); ``--only SECTION`` runs one section (``em``, ``scoring``,
``federated``, ``memory``). Every figure is printed next to its reference with the ratio, and
the run ends with one markdown table (``--out FILE`` also writes it to a file).

What is compared (see benchmarks/README.md for the details):

1. One EM iteration. scikit-learn: ``gm._e_step(X)`` then ``gm._m_step(X, log_resp)`` on a
   ``GaussianMixture`` whose parameters come from a short fit on a subsample. fednovelty:
   ``em_step`` (``e_step_stats`` + ``params_from_stats``), the body of ``fit_em``'s loop, from the
   same parameters. Both results are compared (they must agree) before anything is timed.
2. Scoring throughput: ``score_samples`` vs ``gm.score_samples``.
3. One federated EM round through ``run_simulation`` (``FederatedEM`` with user-given initial
   parameters) vs one centralized iteration on the pooled rows, both on one torch thread,
   alternating; medians of the runs (and the best of each). 300 clients x 3,000 rows by
   default (target 1.2x); ``--clients 10000 --rows-per-client 100`` is the cross-device
   shape, where the round's clients are answered in batched E-steps and their replies
   released, packed, unpacked and checked many at a time (target 1.5x). The federated
   parameters differ from the centralized ones by the clients' privacy floor (the default
   ``PrivacyPolicy``: a component a client backs by fewer than 5 effective rows is sent as
   zeros): at 10,000 x 100, 2,270 of the 100,000 client components, 0.81% of the
   responsibility mass, are withheld, and the means differ by about 1.6e-3. The section
   prints the agreement of a round without the floor (``min_rows=1``) too: 1e-13 (round-off).
4. Peak memory of one EM iteration, each in a fresh subprocess: the high-water mark of the
   resident set size (``VmHWM``, reset after the data and parameters exist) minus the resident
   size at that moment, relative to the size of the data.

Times are the best of at least ``--repeats`` runs (cheap calls are repeated until their block
has run 2 s: see ``best_of``), ours and scikit-learn's in separate blocks with a pause
between them (see ``timed_pair``). Nothing is tuned for this benchmark: the functions timed
are the public ones, called with their defaults.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.mixture import GaussianMixture

from benchmarks.common import REPO, add_out, add_quick, machine_facts, markdown_table
from benchmarks.round_floor import floor_line
from fednovelty.federated import FederatedEM
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture import MixtureParams, precisions_cholesky_from_precisions, score_samples
from fednovelty.mixture.em import em_step
from fednovelty.runtime import run_simulation
from fednovelty.runtime.threads import torch_threads

#: the sections in the order they run (``--only`` picks one).
SECTIONS = ("em", "scoring", "federated", "memory")
N_FEATURES = 32
N_COMPONENTS = 10
REG_COVAR = 1e-6
SEED = 0
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32}


# ----------------------------------------------------------------------------- data and models
def make_data(n_samples: int, dtype: str = "float64", seed: int = SEED) -> np.ndarray:
    """Rows from a K-component Gaussian mixture with random full covariances.

    Written chunk by chunk into one preallocated array, so that creating the data never holds
    more than the data plus one small chunk (this keeps the memory baseline clean).
    """
    rng = np.random.default_rng(seed)
    d, k = N_FEATURES, N_COMPONENTS
    centers = rng.normal(scale=3.0, size=(k, d))
    # Per-component linear maps with singular values in [0.5, 2]: correlated features.
    maps = []
    for _ in range(k):
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        maps.append(q * rng.uniform(0.5, 2.0, size=d))
    X = np.empty((n_samples, d), dtype=dtype)
    step = 65536
    for start in range(0, n_samples, step):
        m = min(step, n_samples - start)
        labels = rng.integers(k, size=m)
        z = rng.normal(size=(m, d))
        block = centers[labels]
        for j in range(k):
            rows = labels == j
            block[rows] += z[rows] @ maps[j]
        X[start : start + m] = block
    return X


def reference_model(X: np.ndarray, covariance_type: str) -> GaussianMixture:
    """A ``GaussianMixture`` with parameters from k-means + 1 EM step on 20,000 rows."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter=1 on purpose
        gm = GaussianMixture(
            N_COMPONENTS,
            covariance_type=covariance_type,
            max_iter=1,
            reg_covar=REG_COVAR,
            random_state=SEED,
        )
        gm.fit(np.asarray(X[:20000], dtype=np.float64))
    return gm


def as_dtype(gm: GaussianMixture, dtype: str) -> GaussianMixture:
    """A shallow copy of ``gm`` with its fitted arrays cast to ``dtype`` (so that scikit-learn
    computes in float32 end to end when the data is float32)."""
    out = copy.copy(gm)
    for name in ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_"):
        setattr(out, name, getattr(gm, name).astype(dtype))
    return out


def ours_params(gm: GaussianMixture, dtype: str) -> MixtureParams:
    t = TORCH_DTYPES[dtype]
    return MixtureParams(
        torch.tensor(gm.weights_, dtype=t),
        torch.tensor(gm.means_, dtype=t),
        torch.tensor(gm.precisions_cholesky_, dtype=t),
        gm.covariance_type,
    )


# ----------------------------------------------------------------------------- the timed calls
def ours_em_iteration(X: torch.Tensor, params: MixtureParams) -> MixtureParams:
    """One iteration of ``fednovelty.mixture.em.fit_em``: E-step statistics, then M-step."""
    return em_step(X, params, REG_COVAR)[0]


def sklearn_em_iteration(gm: GaussianMixture, X: np.ndarray) -> GaussianMixture:
    """One iteration of ``GaussianMixture.fit``'s loop (``_e_step`` then ``_m_step``)."""
    _, log_resp = gm._e_step(X)
    gm._m_step(X, log_resp)
    return gm


PAUSE_S = 1.0  # before each timed block
MIN_BLOCK_S = 2.0  # cheap calls are repeated until a block has run this long ...
MAX_RUNS = 25  # ... or this many times


def best_of(fn, repeats: int, setup=None) -> float:
    """Best seconds of ``fn(setup())`` (``fn()`` without ``setup``) over at least ``repeats``
    calls, and more for cheap calls (until ``MIN_BLOCK_S`` or ``MAX_RUNS``), the same rule
    for both implementations. ``setup`` is untimed."""
    best, total, runs = float("inf"), 0.0, 0
    while runs < repeats or (total < MIN_BLOCK_S and runs < MAX_RUNS):
        arg = setup() if setup else None
        started = time.perf_counter()
        fn(arg) if setup else fn()
        elapsed = time.perf_counter() - started
        best, total, runs = min(best, elapsed), total + elapsed, runs + 1
    return best


def timed_pair(ours_fn, ref_fn, repeats: int, ref_setup=None) -> tuple[float, float]:
    """Best seconds of ``ours_fn()`` and of ``ref_fn(ref_setup())``, each in its own block
    (see ``best_of``).

    The blocks are not interleaved call by call: numpy's OpenBLAS threads keep spinning for a
    while after a BLAS call (and OpenMP threads after a torch call), so whichever runs right
    after the other loses a core to them (measured: 2-3x slower). A pause before each block
    lets them go to sleep. ``ref_setup`` (untimed) makes a fresh reference object for every
    call, because ``_m_step`` overwrites the model's parameters."""
    time.sleep(PAUSE_S)
    ref = best_of(ref_fn, repeats, setup=ref_setup or (lambda: None))
    time.sleep(PAUSE_S)
    ours = best_of(ours_fn, repeats)
    return ours, ref


# ----------------------------------------------------------------------------- results table
@dataclass
class Row:
    metric: str
    ours: str
    ref: str
    ratio: float
    ratio_text: str
    target: str
    met: bool | None

    def cells(self) -> list[str]:
        met = "—" if self.met is None else ("yes" if self.met else "**no**")
        return [self.metric, self.ours, self.ref, self.ratio_text, self.target, met]


def rows_table(rows: list[Row]) -> str:
    header = ["metric", "fednovelty", "scikit-learn", "ratio", "target", "met?"]
    return markdown_table(header, [r.cells() for r in rows])


def fmt_s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def fmt_rate(rows_per_s: float) -> str:
    return f"{rows_per_s / 1e6:.2f} M rows/s"


def say(text: str = "") -> None:
    print(text, flush=True)


# ----------------------------------------------------------------------------- sections
def bench_em(X64: np.ndarray, X32: np.ndarray, models: dict, repeats: int) -> list[Row]:
    rows: list[Row] = []
    n = X64.shape[0]
    say(f"\n## 1. One EM iteration (N={n:,}, d={N_FEATURES}, K={N_COMPONENTS})")
    say("   ours = e_step_stats + params_from_stats; sklearn = gm._e_step + gm._m_step")
    sk64_time: dict[str, float] = {}
    for ct, dtype in (
        ("full", "float64"),
        ("full", "float32"),
        ("diag", "float64"),
        ("diag", "float32"),
    ):
        gm = models[ct]
        X = X64 if dtype == "float64" else X32
        Xt = torch.from_numpy(X)
        params = ours_params(gm, dtype)
        gm_ref = as_dtype(gm, dtype)
        # Agreement first (untimed): both implementations compute the same iteration.
        new_ours = ours_em_iteration(Xt, params)
        new_ref = sklearn_em_iteration(copy.copy(gm_ref), X)
        dm = float(np.abs(new_ours.means.double().numpy() - new_ref.means_).max())
        dc = float(np.abs(new_ours.covariances.double().numpy() - new_ref.covariances_).max())
        ref_dtype = new_ref.means_.dtype
        ours_s, ref_s = timed_pair(
            lambda Xt=Xt, params=params: ours_em_iteration(Xt, params),
            lambda g, X=X: sklearn_em_iteration(g, X),
            repeats,
            ref_setup=lambda gm_ref=gm_ref: copy.copy(gm_ref),
        )
        speedup = ref_s / ours_s
        say(
            f"   {ct:4s} {dtype}: ours {fmt_s(ours_s)}  sklearn({ref_dtype}) {fmt_s(ref_s)}  "
            f"speedup {speedup:.1f}x   [agree: max|dmeans|={dm:.1e}, max|dcov|={dc:.1e}]"
        )
        if dtype == "float64":
            sk64_time[ct] = ref_s
            rows.append(
                Row(
                    f"EM iteration, {ct}, float64",
                    fmt_s(ours_s),
                    fmt_s(ref_s),
                    speedup,
                    f"{speedup:.1f}x faster",
                    ">= 3x",
                    speedup >= 3.0,
                )
            )
        else:
            vs64 = sk64_time[ct] / ours_s
            say(f"   {ct:4s} float32 ours vs sklearn float64: speedup {vs64:.1f}x")
            rows.append(
                Row(
                    f"EM iteration, {ct}, float32 (sklearn float32)",
                    fmt_s(ours_s),
                    fmt_s(ref_s),
                    speedup,
                    f"{speedup:.1f}x faster",
                    ">= 6x",
                    speedup >= 6.0,
                )
            )
            rows.append(
                Row(
                    f"EM iteration, {ct}, float32 (sklearn float64)",
                    fmt_s(ours_s),
                    fmt_s(sk64_time[ct]),
                    vs64,
                    f"{vs64:.1f}x faster",
                    ">= 6x",
                    vs64 >= 6.0,
                )
            )
    return rows


def bench_scoring(X64: np.ndarray, X32: np.ndarray, models: dict, repeats: int) -> list[Row]:
    rows: list[Row] = []
    n = X64.shape[0]
    say(f"\n## 2. Scoring throughput, log p(x) of {n:,} rows")
    say("   ours = fednovelty.mixture.score_samples; sklearn = gm.score_samples")
    for ct, dtype in (("full", "float64"), ("full", "float32"), ("diag", "float64")):
        gm = as_dtype(models[ct], dtype)
        X = X64 if dtype == "float64" else X32
        Xt = torch.from_numpy(X)
        params = ours_params(models[ct], dtype)
        diff = float(
            np.abs(
                score_samples(params, Xt[:20000]).double().numpy() - gm.score_samples(X[:20000])
            ).max()
        )
        ours_s, ref_s = timed_pair(
            lambda Xt=Xt, params=params: score_samples(params, Xt),
            lambda _, gm=gm, X=X: gm.score_samples(X),
            repeats,
        )
        ours_rate, ref_rate = n / ours_s, n / ref_s
        ratio = ours_rate / ref_rate
        say(
            f"   {ct:4s} {dtype}: ours {fmt_rate(ours_rate)}  sklearn {fmt_rate(ref_rate)}  "
            f"ratio {ratio:.1f}x   [agree: max|dlogp|={diff:.1e}]"
        )
        rows.append(
            Row(
                f"scoring rows/s, {ct}, {dtype}",
                fmt_rate(ours_rate),
                fmt_rate(ref_rate),
                ratio,
                f"{ratio:.1f}x faster",
                ">= 5x",
                ratio >= 5.0,
            )
        )
    return rows


#: the ratio a federated round may cost against one centralized iteration, by
#: (clients, rows per client); other shapes are reported without a target.
FEDERATED_TARGETS = {(300, 3_000): 1.2, (30, 3_000): 1.2, (10_000, 100): 1.5}


def bench_federated(
    X64: np.ndarray, gm: GaussianMixture, n_clients: int, rows_per_client: int, repeats: int
) -> list[Row]:
    n = n_clients * rows_per_client
    say(
        f"\n## 3. One federated EM round ({n_clients} clients x {rows_per_client:,} rows, full, "
        "float64) vs one centralized iteration on the pooled rows, both on one torch thread"
    )
    pooled = torch.from_numpy(X64[:n])
    clients = [pooled[c * rows_per_client : (c + 1) * rows_per_client] for c in range(n_clients)]
    init = MixtureParams(
        torch.tensor(gm.weights_),
        torch.tensor(gm.means_),
        precisions_cholesky_from_precisions(torch.tensor(gm.precisions_), "full"),
        "full",
    )

    rounds = 3

    def federated(max_iter: int = 1, privacy: PrivacyPolicy | None = None):
        algorithm = FederatedEM(
            N_COMPONENTS,
            covariance_type="full",
            weights_init=gm.weights_,
            means_init=gm.means_,
            precisions_init=gm.precisions_,
            reg_covar=REG_COVAR,
            max_iter=max_iter,
            tol=0.0,
        )
        return run_simulation(algorithm, clients, privacy=privacy)

    def central() -> float:
        started = time.perf_counter()
        ours_em_iteration(pooled, init)
        return time.perf_counter() - started

    result = federated()
    assert result.state.n_iter == 1 and len(result.history) == 1
    central_params = ours_em_iteration(pooled, init)
    dm = float((result.state.params.means - central_params.means).abs().max())
    dc = float((result.state.params.covariances - central_params.covariances).abs().max())
    # without the clients' floor (module docstring) the round's sums are the pooled ones
    unfloored = federated(privacy=PrivacyPolicy(min_rows=1)).state.params
    dm_off = float((unfloored.means - central_params.means).abs().max())
    dc_off = float((unfloored.covariances - central_params.covariances).abs().max())
    # A round is what the engine times in RoundRecord.seconds: broadcast, every client's
    # E-step and reply, the server's validation, sum and M-step. One-off set-up of a
    # simulation (checking the clients' rows once) is not part of a round, so several rounds
    # run per simulation and its best round counts. The library runs each client step and
    # this server step on one thread (threads.PARALLEL_WORK), so the centralized reference
    # runs on one thread too, and the two alternate so that load from other processes
    # falls on both alike.
    fed_runs, central_runs = [], []
    with torch_threads(1):
        central_runs.append(central())
        for _ in range(max(repeats, 3)):
            fed_runs.append(min(record.seconds for record in federated(rounds).history))
            central_runs.append(central())
        floor = floor_line(pooled, clients, init, float(np.median(central_runs)))
    fed_s, central_s = float(np.median(fed_runs)), float(np.median(central_runs))
    ratio = fed_s / central_s
    target = FEDERATED_TARGETS.get((n_clients, rows_per_client))
    say(
        f"   federated round {fmt_s(fed_s)}  centralized iteration {fmt_s(central_s)}  "
        f"ratio {ratio:.2f}x (medians of {len(fed_runs)} and {len(central_runs)} alternating "
        f"runs; best {min(fed_runs):.3f} s / {min(central_runs):.3f} s = "
        f"{min(fed_runs) / min(central_runs):.2f}x)   [agree: max|dmeans|={dm:.1e}, "
        f"max|dcov|={dc:.1e}; {result.bytes_up / n_clients / 1024:.1f} KiB up per client]"
    )
    say(
        f"   without the privacy floor (min_rows=1): [agree: max|dmeans|={dm_off:.1e}, "
        f"max|dcov|={dc_off:.1e}] (the floor's withheld components make the difference)"
    )
    say(f"   federated rounds: {' '.join(f'{t:.3f}' for t in fed_runs)} s")
    say(f"   centralized iterations: {' '.join(f'{t:.3f}' for t in central_runs)} s")
    say(floor)
    return [
        Row(
            f"federated EM round, {n_clients} clients (ref column: centralized fednovelty, "
            "1 thread, medians)",
            fmt_s(fed_s),
            fmt_s(central_s),
            ratio,
            f"{ratio:.2f}x the time",
            "-" if target is None else f"<= {target:g}x",
            None if target is None else ratio <= target,
        )
    ]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def memory_worker(impl: str, covariance_type: str, dtype: str, n_samples: int) -> None:
    """Run in a fresh process: build data and parameters, then measure one EM iteration."""
    X = make_data(n_samples, dtype)
    gm = reference_model(X, covariance_type)
    if impl == "ours":
        Xt = torch.from_numpy(X)
        params = ours_params(gm, dtype)

        def run(rows: int | None = None):
            return ours_em_iteration(Xt[:rows], params)

    else:
        gm = as_dtype(gm, dtype)

        def run(rows: int | None = None):
            return sklearn_em_iteration(copy.copy(gm), X[:rows])

    # Warm up on a few rows: one-time costs (library code paged in, thread pools, allocator
    # arenas) are the same for any N and would swamp the ratio for small data.
    run(2000)
    try:  # give freed heap pages back, so that the iteration cannot reuse them unseen
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    method = "VmHWM reset via /proc/self/clear_refs"
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        base_kib = _status_kib("VmRSS")
        run()
        peak_kib = _status_kib("VmHWM")
    except OSError:  # no clear_refs: ru_maxrss may include the setup's peak (an upper bound)
        method = "ru_maxrss (may include setup peak)"
        base_kib = _status_kib("VmRSS")
        run()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extra = max(0, peak_kib - base_kib) * 1024
    print(json.dumps({"extra_bytes": extra, "data_bytes": X.nbytes, "method": method}))


def measure_memory(impl: str, ct: str, dtype: str, n: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_mixture", "--memory-worker"]
    cmd += [impl, ct, dtype, str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_memory(n: int, configs) -> list[Row]:
    rows: list[Row] = []
    say(f"\n## 4. Peak memory of one EM iteration (N={n:,}; fresh process each)")
    say("   peak = data + extra; extra = VmHWM during the iteration - VmRSS just before it")
    for ct, dtype in configs:
        ours = measure_memory("ours", ct, dtype, n)
        ref = measure_memory("sklearn", ct, dtype, n)
        data = ours["data_bytes"]
        ours_x = 1 + ours["extra_bytes"] / data
        ref_x = 1 + ref["extra_bytes"] / ref["data_bytes"]
        mib = 1024 * 1024
        ours_mib, ref_mib = ours["extra_bytes"] / mib, ref["extra_bytes"] / mib
        say(
            f"   {ct:4s} {dtype}: data {data / mib:.0f} MiB; extra ours {ours_mib:.0f} MiB, "
            f"sklearn {ref_mib:.0f} MiB; peak/data ours {ours_x:.2f}x, sklearn {ref_x:.2f}x  "
            f"[{ours['method']}]"
        )
        rows.append(
            Row(
                f"peak memory / data size, {ct}, {dtype}",
                f"{ours_x:.2f}x",
                f"{ref_x:.2f}x",
                ref_x / ours_x,
                f"sklearn uses {ref_x / ours_x:.1f}x ours",
                "ours <= 2.5x",
                ours_x <= 2.5,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser, "small N: a smoke run under 1 min")
    add_out(parser, "also write the markdown table to this file")
    parser.add_argument("--repeats", type=int, help="timed repeats (best of); default 3, quick 2")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory section")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        help="run only this section (em, scoring, federated or memory)",
    )
    parser.add_argument(
        "--clients", type=int, help="clients in the federated section (default 300, quick 30)"
    )
    parser.add_argument(
        "--rows-per-client", type=int, help="rows of each client there (default 3,000)"
    )
    parser.add_argument("--memory-worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker:
        impl, ct, dtype, n = args.memory_worker
        memory_worker(impl, ct, dtype, int(n))
        return 0

    n = 100_000 if args.quick else 1_000_000
    n_clients = args.clients or (30 if args.quick else 300)
    rows_per_client = args.rows_per_client or 3_000
    repeats = args.repeats or (2 if args.quick else 3)
    global MIN_BLOCK_S
    MIN_BLOCK_S = 0.5 if args.quick else MIN_BLOCK_S
    started = time.perf_counter()
    say("# fednovelty mixture benchmark" + (" (--quick)" if args.quick else ""))
    say(machine_facts())
    load_start = os.getloadavg()[0]

    sections = SECTIONS if args.only is None else (args.only,)
    if args.no_memory:
        sections = tuple(name for name in sections if name != "memory")
    rows: list[Row] = []
    if {"em", "scoring", "federated"} & set(sections):
        X64 = np.ascontiguousarray(make_data(max(n, n_clients * rows_per_client))[:n])
        types = ("full",) if args.only == "federated" else ("full", "diag")
        models = {ct: reference_model(X64, ct) for ct in types}
    if "em" in sections or "scoring" in sections:
        X32 = X64.astype(np.float32)
        if "em" in sections:
            rows += bench_em(X64, X32, models, repeats)
        if "scoring" in sections:
            rows += bench_scoring(X64, X32, models, repeats)
        del X32
    if "federated" in sections:
        n_fed = n_clients * rows_per_client
        X_fed = X64 if n >= n_fed else make_data(n_fed)
        rows += bench_federated(X_fed, models["full"], n_clients, rows_per_client, repeats)
    if "memory" in sections:
        configs = [("full", "float64")]
        if not args.quick:
            configs += [("full", "float32"), ("diag", "float64")]
        rows += bench_memory(n, configs)

    table = rows_table(rows)
    elapsed = time.perf_counter() - started
    load_end = os.getloadavg()[0]
    say("\n## Summary")
    say(machine_facts())
    say(
        f"N={n:,}, d={N_FEATURES}, K={N_COMPONENTS}; times: best of >= {repeats} runs "
        f"(cheap calls until {MIN_BLOCK_S:g} s or {MAX_RUNS} runs); took {elapsed:.0f} s"
    )
    if max(load_start, load_end) > (os.cpu_count() or 1):
        say(
            f"WARNING: 1-minute load average reached {max(load_start, load_end):.1f} on "
            f"{os.cpu_count()} CPUs; other processes competed for the cores, so times are "
            "noisy (multi-threaded torch kernels suffer most). Rerun on an idle machine."
        )
    say()
    say(table)
    missed = [r.metric for r in rows if r.met is False]
    say("\nall targets met" if not missed else f"\ntargets missed: {'; '.join(missed)}")
    if args.out:
        args.out.write_text(table + "\n")
        say(f"(table written to {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
