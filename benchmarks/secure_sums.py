"""Secure sums of mixture statistics against a plain sum: time, bytes and quantisation error.

Each client holds the summed statistics of a full-covariance Gaussian mixture with ``K = 8``
components in ``d`` dimensions (``counts`` (K,), ``sums`` (K, d), ``second`` (K, d, d),
``n_samples`` (): ``K + K d + K d^2 + 1`` floats) over its own rows: up to ``MAX_ROWS``
standard-normal rows, each clipped to the L2 ball of radius ``BOUND`` (``dp.clip_rows``), with
Dirichlet responsibilities. The public clipping ranges follow from those bounds: counts and
``n_samples`` ``MAX_ROWS``, first moments ``MAX_ROWS * BOUND``, second moments
``MAX_ROWS * BOUND**2``.

For each ``(d, m, dropped, bits)`` (:data:`GRID`), one secure sum
(``fednovelty.federated.secure.secure_sum``, threshold ``m // 2 + 1``, AES-CTR masks) and the
plain sum (torch, float64) of the same statistics. Columns: the secure sum's wall time (all
parties in turn, one thread) and its split into client work per client and server work, the
plain sum's time and the ratio; bytes a client sends (masked vector at ``bits / 8`` bytes a
value, keys, encrypted shares, revealed shares) against the plain float64 upload, and bytes
it receives; the largest error of any summed value over its tensor's clipping range, beside
the bound :func:`~fednovelty.federated.secure.error_bound` gives (same scale).

Second section, federated EM with secure sums: ``FederatedEM`` under
``dp_mode="distributed"`` on ADBench Forest Covertype (``make_task("10_cover", "novelty",
n_clients=20, alpha=0.5, seed=0, max_train=50000)``; 10 features min-max scaled, public
bounds ``[0, 1]``), ``K = 15`` full covariances, ``epsilon = 1`` at ``delta = 1e-5`` over 44
releases (1 moments round, 3 Lloyd rounds, 40 EM rounds; ``calibrate_noise(1.0, 1e-5, 44)``),
clip ``B = 1.5 sqrt(d)``, run twice with the same seeds: plain (the server reads every reply)
and through ``run_simulation(..., secure_sum=SecureSum())`` (48-bit ring, majority
threshold; the server step reads one combined reply). Columns: time and bytes per round of
each, and the largest difference of the final means and covariances relative to their
scale, beside the quantisation bound (relative to each tensor's clipping range) and the
noise the sums carry.

Options: ``--quick`` (d = 10 and m = 3 only; EM on 5 clients, 5,000 rows, K = 4, 3 EM
rounds), ``--out PATH`` (default ``benchmarks/secure_sums.txt``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit_report, report_header

from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.dp import BLOCK_SPLIT, DPPolicy, calibrate_noise, clip_rows
from fednovelty.federated.secure import secure_sum
from fednovelty.runtime import run_simulation
from fednovelty.runtime.secure_rounds import SecureSum

K = 8
MAX_ROWS = 2_000
BOUND = 3.0
#: (d, m, number of clients dropped before masking, ring bits).
GRID = [
    (10, 3, 0, 32),
    (10, 10, 0, 32),
    (10, 30, 0, 32),
    (54, 3, 0, 32),
    (54, 10, 0, 32),
    (54, 30, 0, 32),
    (54, 10, 1, 32),
    (54, 30, 3, 32),
    (54, 30, 0, 48),
]
QUICK_GRID = [(10, 3, 0, 32), (10, 3, 1, 32)]
OUT = Path(__file__).resolve().parent / "secure_sums.txt"


def client_statistics(d: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """One client's summed statistics (module docstring), float64."""
    n = int(rng.integers(MAX_ROWS // 4, MAX_ROWS + 1))
    X = clip_rows(
        torch.tensor(rng.normal(0, 1, (n, d))), torch.zeros(d, dtype=torch.float64), BOUND
    )
    resp = torch.tensor(rng.dirichlet(np.ones(K), n))
    return {
        "counts": resp.sum(0),
        "sums": resp.T @ X,
        "second": torch.einsum("nk,ni,nj->kij", resp, X, X),
        "n_samples": torch.tensor(float(n), dtype=torch.float64),
    }


def clip_ranges() -> dict[str, float]:
    return {
        "counts": float(MAX_ROWS),
        "sums": MAX_ROWS * BOUND,
        "second": MAX_ROWS * BOUND**2,
        "n_samples": float(MAX_ROWS),
    }


def plain_sum(clients: dict[int, dict[str, torch.Tensor]], ids: list[int]) -> tuple[dict, float]:
    start = time.perf_counter()
    total = {name: torch.stack([clients[c][name] for c in ids]).sum(0) for name in clients[ids[0]]}
    return total, time.perf_counter() - start


def run_case(d: int, m: int, n_dropped: int, bits: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    clients = {c: client_statistics(d, rng) for c in range(m)}
    dropped = set(range(n_dropped))
    survivors = [c for c in range(m) if c not in dropped]
    clips = clip_ranges()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        sums, report = secure_sum(
            clients, clip_range=clips, threshold=m // 2 + 1, bits=bits, dropped=dropped, seed=seed
        )
        runs.append((time.perf_counter() - start, sums, report))
    secure_seconds, sums, report = sorted(runs, key=lambda run: run[0])[1]
    plain, plain_seconds = plain_sum(clients, survivors)
    # plain sums take microseconds: the median of 20 repeats
    plain_seconds = float(np.median([plain_sum(clients, survivors)[1] for _ in range(20)]))
    error = max(float((sums[k] - plain[k]).abs().max()) / clips[k] for k in sums)
    bound = max(report.error_bound[k] / clips[k] for k in sums)
    assert error <= bound, (error, bound)
    client_steps = report.seconds["setup"] + report.seconds["share_keys"] + report.seconds["mask"]
    return {
        "d": d,
        "m": m,
        "dropped": n_dropped,
        "bits": bits,
        "values": report.n_values,
        "secure_s": secure_seconds,
        "client_s": client_steps / m,
        "unmask_s": report.seconds["unmask"],
        "plain_s": plain_seconds,
        "up_bytes": np.mean([sum(report.bytes_up[c].values()) for c in survivors]),
        "plain_up": 8 * report.n_values,
        "down_bytes": np.mean([sum(report.bytes_down[c].values()) for c in survivors]),
        "error": error,
        "bound": bound,
    }


def table(rows: list[dict[str, float]]) -> str:
    header = (
        "| d | m | dropped | bits | floats | secure s | client s | unmask s | plain s | time ratio "
        "| up B/client | plain up B | up ratio | down B/client | max err / clip | bound / clip |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['d']} | {r['m']} | {r['dropped']} | {r['bits']} | {r['values']:,} "
            f"| {r['secure_s']:.3f} | {r['client_s']:.4f} | {r['unmask_s']:.3f} "
            f"| {r['plain_s'] * 1e6:.0f} us | {r['secure_s'] / r['plain_s']:,.0f} "
            f"| {r['up_bytes']:,.0f} | {r['plain_up']:,} | {r['up_bytes'] / r['plain_up']:.2f} "
            f"| {r['down_bytes']:,.0f} | {r['error']:.2e} | {r['bound']:.2e} |"
        )
    return "\n".join(lines)


def em_clients(quick: bool) -> dict[int, torch.Tensor]:
    """The Covertype clients' training rows (clients without rows left out)."""
    from fednovelty.datasets.protocols import make_task

    n_clients, rows = (5, 5_000) if quick else (20, 50_000)
    task = make_task("10_cover", "novelty", n_clients=n_clients, alpha=0.5, seed=0, max_train=rows)
    parts = {c: task.X_train[task.groups_train == c] for c in range(n_clients)}
    return {c: torch.as_tensor(X) for c, X in parts.items() if len(X)}


def em_case(quick: bool) -> dict[str, float]:
    """The federated-EM section (module docstring): plain and secure runs, same seeds."""
    clients = em_clients(quick)
    m = len(clients)
    d = int(next(iter(clients.values())).shape[1])
    releases = 44
    z = calibrate_noise(1.0, 1e-5, releases)
    clip = 1.5 * math.sqrt(d)
    params = {
        "n_components": 4 if quick else 15,
        "bounds": ([0.0] * d, [1.0] * d),
        "standardize": True,
        "dp_mode": "distributed",
        "dp_noise_multiplier": z,
        "dp_clip": clip,
        "kmeans_rounds": 3,
        "max_iter": 3 if quick else 40,
        "random_state": 0,
    }
    policy = PrivacyPolicy(dp=DPPolicy(z, clip, "distributed", m, releases, seed=0))
    runs = {}
    for name, secure in (("plain", None), ("secure", SecureSum())):
        start = time.perf_counter()
        result = run_simulation(FederatedEM(**params), clients, privacy=policy, secure_sum=secure)
        runs[name] = (result, time.perf_counter() - start)
    (plain, plain_s), (secure, secure_s) = runs["plain"], runs["secure"]
    history = secure.history
    n_rounds = len(history)

    def relative(name: str) -> float:
        a, b = getattr(plain.state.params, name), getattr(secure.state.params, name)
        return float((a - b).abs().max() / a.abs().max())

    bound = max(
        v / r.metrics[k.replace("bound", "clip")]
        for r in history
        for k, v in r.metrics.items()
        if k.startswith("secure_bound_")
    )
    em_round = history[-1].metrics
    return {
        "clients": m,
        "rows": sum(int(X.shape[0]) for X in clients.values()),
        "K": params["n_components"],
        "rounds": n_rounds,
        "z": z,
        "plain_s": plain_s / len(plain.history),
        "secure_s": secure_s / n_rounds,
        "protocol_s": float(np.mean([r.metrics["secure_seconds"] for r in history])),
        "plain_up": plain.bytes_up / len(plain.history),
        "secure_up": float(np.mean([r.metrics["secure_bytes_up"] for r in history])),
        "plain_down": plain.bytes_down / len(plain.history),
        "secure_down": float(
            np.mean([r.bytes_down + r.metrics["secure_bytes_down"] for r in history])
        ),
        "means": relative("means"),
        "covariances": relative("covariances"),
        "bound": bound,
        "second_bound": em_round["secure_bound_second"],
        "second_noise": z * BLOCK_SPLIT["second"] * clip**2,
    }


def em_table(r: dict[str, float]) -> str:
    head = (
        "| clients | rows | K | rounds | plain s/round | secure s/round | protocol s/round "
        "| plain up B/round | secure up B/round | plain down B/round | secure down B/round "
        "| max diff means / scale | max diff covariances / scale | bound / clip "
        "| bound on summed second moments | noise std on them |"
    )
    line = (
        f"| {r['clients']} | {r['rows']:,} | {r['K']} | {r['rounds']} | {r['plain_s']:.3f} "
        f"| {r['secure_s']:.3f} | {r['protocol_s']:.3f} | {r['plain_up']:,.0f} "
        f"| {r['secure_up']:,.0f} | {r['plain_down']:,.0f} | {r['secure_down']:,.0f} "
        f"| {r['means']:.2e} | {r['covariances']:.2e} | {r['bound']:.2e} "
        f"| {r['second_bound']:.2e} | {r['second_noise']:.3g} |"
    )
    return "\n".join([head, "|" + "---|" * (head.count("|") - 1), line])


def em_notes(r: dict[str, float]) -> str:
    return (
        f"FederatedEM, dp_mode='distributed', noise multiplier z = {r['z']:.2f} (epsilon 1, "
        "delta 1e-5, 44 releases), the same seeds in both runs (the clients' noise is the "
        "same). Per round: 's/round' the whole round (client steps, gate, server step; "
        "secure: the protocol too), 'protocol s' the secure sum alone (every party in turn, "
        "one thread); bytes: plain up = the replies (float64), secure up = every client's "
        "protocol messages (keys, encrypted shares, masked vector at 6 bytes a value, "
        "revealed shares), down = the broadcast plus (secure) relayed keys and shares. "
        "'max diff / scale': the largest |secure - plain| of the final means and "
        "covariances over the largest |plain| value; 'bound / clip': the quantisation bound "
        "of any summed value over its clipping range, any round; the last two columns put "
        "the bound on one summed second moment beside the noise the sum carries."
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 10, m = 3 only")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    run_case(10, 3, 0, 32)  # warm-up: imports and first calls
    rows = [run_case(*case) for case in (QUICK_GRID if args.quick else GRID)]
    em = em_case(args.quick)
    command = "python benchmarks/secure_sums.py" + (" --quick" if args.quick else "")
    notes = (
        f"K = {K} components, full covariance; rows clipped to L2 radius {BOUND}, at most "
        f"{MAX_ROWS} rows a client; threshold m // 2 + 1; AES-CTR masks. 'secure s': every "
        "party in turn, one thread, the median of 3 runs; 'client s': one client's setup, "
        "sharing and masking; "
        "'unmask s': the clients' share reveals and the server's unmasking; 'plain s': "
        "torch's float64 sum over clients (median of 20). Bytes: the mean over the clients that "
        "sent a masked vector, all their messages; plain up = 8 bytes a float. Error: the "
        "largest |secure - plain| of any value over its tensor's clipping range, and the "
        "bound the module derives."
    )
    report = "\n\n".join(
        [
            report_header(
                "Secure sums of mixture statistics",
                command,
                args.quick,
                time.perf_counter() - start,
            ),
            notes,
            table(rows),
            "## Federated EM with secure sums",
            em_notes(em),
            em_table(em),
        ]
    )
    return emit_report(report + "\n", args.out)


if __name__ == "__main__":
    main()
