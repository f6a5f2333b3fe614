"""Secure sums of mixture statistics against a plain sum: time, bytes and quantisation error.

Each client holds the summed statistics of a full-covariance Gaussian mixture with ``K = 8``
components in ``d`` dimensions (``counts`` (K,), ``sums`` (K, d), ``second`` (K, d, d),
``n_samples`` (): ``K + K d + K d^2 + 1`` floats) over its own rows: up to ``MAX_ROWS``
standard-normal rows, each clipped to the L2 ball of radius ``BOUND`` (``dp_mechanism.clip_rows``),
with Dirichlet responsibilities. The public clipping ranges follow from those bounds: counts and
``n_samples`` ``MAX_ROWS``, first moments ``MAX_ROWS * BOUND``, second moments
``MAX_ROWS * BOUND**2``.

For each ``(d, m, dropped, bits)`` (:data:`GRID`), one secure sum
(``fednovelty.federated.trust.secure.secure_sum``, threshold ``m // 2 + 1``, AES-CTR masks) and the
plain sum (torch, float64) of the same statistics. Columns: the secure sum's wall time (all
parties in turn, one thread) and its split into client work per client and server work, the
plain sum's time and the ratio; bytes a client sends (masked vector at ``bits / 8`` bytes a
value, keys, encrypted shares, revealed shares) against the plain float64 upload, and bytes
it receives; the largest error of any summed value over its tensor's clipping range, beside
the bound :func:`~fednovelty.federated.trust.secure.error_bound` gives (same scale).

Second section, federated EM with secure sums: ``FederatedEM`` under
``dp_mode="distributed"`` on ADBench Forest Covertype (``make_task("10_cover", "novelty",
n_clients=20, alpha=0.5, seed=0, max_train=50000)``; 10 features min-max scaled, public
bounds ``[0, 1]``), ``K = 15`` full covariances, ``epsilon = 1`` at ``delta = 1e-5`` over 44
releases (1 moments round, 3 Lloyd rounds, 40 EM rounds; ``calibrate_noise(1.0, 1e-5, 44)``),
clip ``B = 1.5 sqrt(d)``, run twice with the same DP noise (the policy's test-only
``insecure_seed``): plain (the server reads every reply; the run's
``UnsummedDistributedWarning`` is expected and silenced) and through ``run_simulation(...,
secure_sum=SecureSum(max_rows=N))`` (48-bit ring, majority threshold, ``N`` the largest
client's rows, the public bound this benchmark's author states; the server step reads one
combined reply). Columns: time and bytes per round of
each, and the largest difference of the final means and covariances relative to their
scale, beside the quantisation bound (relative to each tensor's clipping range) and the
noise the sums carry.

Third section (``--flower``), the same on a Flower deployment: a SuperLink and three
SuperNodes on 127.0.0.1 (``fednovelty.runtime.flower.deploy.LocalFederation``, insecure
loopback, the app ``examples/flower`` with the ``secure-*`` run-config keys declared),
each node holding one Dirichlet(0.5) Covertype client of ``make_task("10_cover", "novelty",
n_clients=3, alpha=0.5, seed=0, max_train=6000)`` and its own DP settings in its node
config (``dp-mode = "distributed"``, ``dp-clients = 3``, epsilon 1 at delta 1e-5 over the
run's 5 releases, clip ``sqrt(d)`` about the origin of the ``[0, 1]`` box). ``FederatedEM``
(``K = 4`` full covariances, 1 k-means round and 4 EM rounds) runs with ``secure-sum = true``
(48-bit ring, majority threshold, ``secure-max-rows`` the largest node's rows). A node in
distributed mode answers no plain round, so the plain baseline of time and bytes runs on a
second deployment of the same nodes in ``dp-mode = "local"`` (the same messages, each node
adding all of the noise), and the secure mixture is compared with the in-process plain
simulation under the same DP noise (each node's test-only ``dp-insecure-seed``). Columns:
wall time per round of each and their ratio, the secure round's split over the protocol's
four exchanges, bytes per round per node of every Flower message (up and down) of each and
their ratios, and the largest difference of the final means and covariances relative to
their scale beside the quantisation bound.

Options: ``--quick`` (d = 10 and m = 3 only; EM on 5 clients, 5,000 rows, K = 4, 3 EM
rounds), ``--flower`` (add the Flower section; about 10 minutes),
``--out PATH`` (default ``benchmarks/secure_sums.txt``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import add_out, add_quick, emit_report, report_header
from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.federated.trust.dp_mechanism import clip_rows
from fednovelty.federated.trust.dp_split import BLOCK_SPLIT
from fednovelty.federated.trust.secure import secure_sum
from fednovelty.runtime import run_simulation
from fednovelty.runtime.secure_rounds import SecureSum
from fednovelty.runtime.simulation import UnsummedDistributedWarning

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
            clients, clip_range=clips, threshold=m // 2 + 1, bits=bits, dropped=dropped
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
    # the same noise in both runs: a test seed, no privacy guarantee (a benchmark's baseline)
    policy = PrivacyPolicy(dp=DPPolicy(z, clip, "distributed", m, insecure_seed=0))
    rows = max(int(X.shape[0]) for X in clients.values())  # the public bound stated here
    runs = {}
    for name, secure in (("plain", None), ("secure", SecureSum(max_rows=rows))):
        start = time.perf_counter()
        with warnings.catch_warnings():  # the plain baseline reads each reply, knowingly
            warnings.simplefilter("ignore", UnsummedDistributedWarning)
            result = run_simulation(
                FederatedEM(**params), clients, privacy=policy, secure_sum=secure
            )
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


APP = Path(__file__).resolve().parents[1] / "examples" / "flower"
FLOWER_NODES, FLOWER_ROUNDS = 3, 5


def flower_app(work: Path) -> Path:
    """A copy of ``examples/flower`` (its run config declares the ``secure-*`` keys)."""
    app = work / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    return app


def flower_case() -> dict[str, float]:
    """The Flower section (module docstring): plain and secure runs on one deployment."""
    from fednovelty.datasets.protocols import make_task
    from fednovelty.runtime.flower.deploy import LocalFederation

    task = make_task("10_cover", "novelty", n_clients=FLOWER_NODES, alpha=0.5, seed=0,
                     max_train=6_000)  # fmt: skip
    parts = [task.X_train[task.groups_train == c] for c in range(FLOWER_NODES)]
    d = int(parts[0].shape[1])
    z = calibrate_noise(1.0, 1e-5, FLOWER_ROUNDS)
    clip = math.sqrt(d)
    params = {
        "n_components": 4,
        "bounds": [[0.0] * d, [1.0] * d],
        "dp_mode": "distributed",
        "dp_noise_multiplier": z,
        "dp_clip": clip,
        "kmeans_rounds": 1,
        "max_iter": FLOWER_ROUNDS - 1,
        "random_state": 0,
    }
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        configs = {"local": [], "distributed": []}
        for c, X in enumerate(parts):
            np.save(work / f"part{c}.npy", X)
            for mode, nodes in configs.items():  # a test seed: the simulation's noise
                dp = {"dp-epsilon": 1.0, "dp-releases": FLOWER_ROUNDS, "dp-clip": clip,
                      "dp-mode": mode, "dp-clients": FLOWER_NODES,
                      "dp-insecure-seed": 0}  # fmt: skip
                nodes.append({"partition-id": c, "data-path": str(work / f"part{c}.npy"), **dp})
        app = flower_app(work)
        base = {"algorithm": "FederatedEM", "num-nodes": FLOWER_NODES, "seed": 0}
        secure = {"secure-sum": True, "secure-max-rows": max(len(X) for X in parts)}
        plain_params = json.dumps({**params, "dp_mode": "local"})
        runs = {}
        for name, mode, extra in (
            ("plain", "local", {"algorithm-params": plain_params}),
            ("secure", "distributed", {"algorithm-params": json.dumps(params), **secure}),
        ):
            with LocalFederation(configs[mode], workdir=work / f"deployment-{name}") as nodes:
                start = time.perf_counter()
                result = nodes.run_app(app, {**base, **extra}, timeout=1800)
                runs[name] = (result, time.perf_counter() - start)
    (plain, plain_run_s), (secure_run, secure_run_s) = runs["plain"], runs["secure"]
    clients = {c: torch.as_tensor(X) for c, X in enumerate(parts)}
    policy = PrivacyPolicy(dp=DPPolicy(z, clip, "distributed", FLOWER_NODES, insecure_seed=0))
    with warnings.catch_warnings():  # the reference reads each reply, knowingly
        warnings.simplefilter("ignore", UnsummedDistributedWarning)
        reference = run_simulation(FederatedEM(**params), clients, privacy=policy)

    def per_round(result, key: str) -> float:
        return float(np.mean([r.metrics[key] for r in result.history])) / FLOWER_NODES

    def relative(name: str) -> float:
        a = getattr(reference.state.params, name)
        b = getattr(secure_run.state.params, name)
        return float((a - b).abs().max() / a.abs().max())

    history = secure_run.history
    assert all(r.metrics["secure_senders"] == FLOWER_NODES for r in history)
    steps = {
        step: float(np.mean([r.metrics[f"secure_seconds_{step}"] for r in history]))
        for step in ("setup", "share_keys", "mask", "unmask")
    }
    return {
        "nodes": FLOWER_NODES,
        "rows": sum(len(X) for X in parts),
        "d": d,
        "K": params["n_components"],
        "rounds": len(history),
        "z": z,
        "plain_s": float(np.mean([r.seconds for r in plain.history])),
        "secure_s": float(np.mean([r.seconds for r in history])),
        "plain_run_s": plain_run_s,
        "secure_run_s": secure_run_s,
        **{f"{step}_s": seconds for step, seconds in steps.items()},
        "plain_up": per_round(plain, "wire_bytes_up"),
        "plain_down": per_round(plain, "wire_bytes_down"),
        "secure_up": per_round(secure_run, "secure_wire_bytes_up"),
        "secure_down": per_round(secure_run, "secure_wire_bytes_down"),
        "means": relative("means"),
        "covariances": relative("covariances"),
        "bound": max(
            v / r.metrics[k.replace("bound", "clip")]
            for r in history
            for k, v in r.metrics.items()
            if k.startswith("secure_bound_")
        ),
    }


def flower_table(r: dict[str, float]) -> str:
    head = (
        "| nodes | rows | d | K | rounds | plain s/round | secure s/round | time ratio "
        "| keys s | shares s | masked input s | unmask s "
        "| plain up B/node/round | secure up B/node/round | up ratio "
        "| plain down B/node/round | secure down B/node/round | down ratio "
        "| max diff means / scale | max diff covariances / scale | bound / clip |"
    )
    line = (
        f"| {r['nodes']} | {r['rows']:,} | {r['d']} | {r['K']} | {r['rounds']} "
        f"| {r['plain_s']:.1f} | {r['secure_s']:.1f} | {r['secure_s'] / r['plain_s']:.1f} "
        f"| {r['setup_s']:.1f} | {r['share_keys_s']:.1f} | {r['mask_s']:.1f} "
        f"| {r['unmask_s']:.1f} "
        f"| {r['plain_up']:,.0f} | {r['secure_up']:,.0f} | {r['secure_up'] / r['plain_up']:.1f} "
        f"| {r['plain_down']:,.0f} | {r['secure_down']:,.0f} "
        f"| {r['secure_down'] / r['plain_down']:.1f} "
        f"| {r['means']:.2e} | {r['covariances']:.2e} | {r['bound']:.2e} |"
    )
    return "\n".join([head, "|" + "---|" * (head.count("|") - 1), line])


def flower_notes(r: dict[str, float]) -> str:
    return (
        f"FederatedEM on a Flower deployment of {r['nodes']} SuperNodes and a SuperLink on "
        f"127.0.0.1, dp_mode='distributed' set by each node's config (z = {r['z']:.2f}: "
        f"epsilon 1, delta 1e-5, {FLOWER_ROUNDS} releases); the plain baseline on the same "
        "nodes in dp-mode 'local' (a distributed node answers no plain round). "
        "'s/round': the round's wall time on the ServerApp (RoundRecord.seconds); secure: "
        "the four exchanges (keys, shares, masked input with the broadcast, unmask; "
        "their means per round beside it) and the server step. Each Flower message starts "
        "a fresh ClientApp process on its node (importing torch and fednovelty), so a "
        "secure round pays four process starts a node where a plain round pays one; the "
        "machine's other load shows in these times. Bytes: every Flower record of the "
        "round (wire_bytes_* plain, secure_wire_bytes_* secure: keys, relayed keys, "
        "encrypted shares, the broadcast, masked vectors at 6 bytes a value, revealed "
        "shares) divided by the nodes. 'max diff / scale': the largest |secure - plain| "
        "of the final means and covariances over the largest |plain| value, plain the "
        "in-process simulation under the same DP noise; 'bound / "
        f"clip': the quantisation bound over its clipping range, any round. Whole runs "
        f"(flwr run, app start included): plain {r['plain_run_s']:.0f} s, secure "
        f"{r['secure_run_s']:.0f} s."
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(parser, "d = 10, m = 3 only")
    parser.add_argument(
        "--flower", action="store_true", help="add the 3-node Flower deployment section"
    )
    add_out(parser, default=OUT)
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    run_case(10, 3, 0, 32)  # warm-up: imports and first calls
    rows = [run_case(*case) for case in (QUICK_GRID if args.quick else GRID)]
    em = em_case(args.quick)
    flower = flower_case() if args.flower else None
    command = "python -m benchmarks.secure_sums" + (" --quick" if args.quick else "")
    command += " --flower" if args.flower else ""
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
            *(
                ()
                if flower is None
                else (
                    "## Federated EM with secure sums on a Flower deployment",
                    flower_notes(flower),
                    flower_table(flower),
                )
            ),
        ]
    )
    return emit_report(report + "\n", args.out)


if __name__ == "__main__":
    main()
