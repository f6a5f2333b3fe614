"""Flower's Simulation Engine at scale: seconds per round of federated EM on 100, 1,000 and
10,000 virtual clients, beside the in-process engine in the same run, and how far apart the
two engines' models are.

Each client holds ``--rows`` rows (default 100) of ``--features`` features (8) drawn from a
mixture of ``--components`` (4) Gaussians with weights of its own (Dirichlet(1)); every
client's rows come from a generator seeded by its id, so a cell is the same federation
whenever it runs. ``FederatedEM(n_components=K, kmeans_rounds=1, max_iter=1, tol=0)``: three
rounds (``centroids``, ``assign``, ``em``), the default privacy floor (5 rows). One cell is
one engine at one size:

- ``in-process``: :func:`fednovelty.runtime.run_simulation`;
- ``flower-sim``: :func:`fednovelty.runtime.flower.sim_engine.run_flower_simulation` on a Ray
  started once by this script with ``--ray-cpus`` CPUs (default: every core) and one CPU per
  ClientApp actor, so as many actors as CPUs.

Per cell: each round's seconds (``RoundRecord.seconds``), the run's wall time, and the fitted
parameters. The report gives round 1 apart (on flower-sim it includes starting the actors,
which import torch, Flower and fednovelty), the mean of the later rounds (warm), that mean
per client (the cost of one client's message and step), and the largest difference between
the two engines' parameters relative to each tensor's largest magnitude.

Beside the cells, one delivery pass of Flower's in-memory LinkState at each size (the
Simulation Engine's message extractor asks every node for its message; each request checks
the messages stored before its own, so a pass grows as the clients squared), measured with
Flower's own classes. A flower-sim cell whose projected time for its 3 rounds is above
``--budget`` seconds (default 1800) is not run: the power law through the warm rounds of the
two largest cells measured where there are two, else a lower bound (each round one measured
pass plus the clients times the per-client cost of the smallest cell). The report then gives
both, marked as projections (with ``--report-only`` too). Every finished cell is kept as JSON under
``benchmarks/results/flower_sim_scale_cells/`` with the settings it ran under, so a long run
resumes (a cell is run again when its settings differ). Report:
``benchmarks/results/flower_sim_scale.md``; ``--quick``: 10 and 30 clients, 20 rows each,
report and cells under ``--out``.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.flower_sim_scale [--clients 100 1000 10000]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ENGINES = ("in-process", "flower-sim")


def federation(n_clients: int, rows: int, features: int, components: int, seed: int = 0):
    """``n_clients`` tensors (rows, features): a mixture of ``components`` Gaussians with
    common means and covariances (from ``seed``) and client weights Dirichlet(1), each
    client's rows from a generator seeded by ``(seed, client id)``."""
    import torch

    rng = np.random.default_rng(seed)
    means = rng.normal(scale=4.0, size=(components, features))
    scales = rng.uniform(0.5, 1.5, size=(components, features))
    clients = []
    for c in range(n_clients):
        local = np.random.default_rng([seed, c])
        weights = local.dirichlet(np.ones(components))
        labels = local.choice(components, size=rows, p=weights)
        X = means[labels] + scales[labels] * local.normal(size=(rows, features))
        clients.append(torch.as_tensor(X))
    return clients


def algorithm(components: int):
    """Federated EM: one k-means round to start, one EM round (three rounds)."""
    from fednovelty.federated.registry import build_algorithm

    params = {"n_components": components, "kmeans_rounds": 1, "max_iter": 1, "tol": 0.0}
    return build_algorithm("FederatedEM", params)


def settings_of(args: argparse.Namespace, engine: str, n_clients: int) -> dict[str, Any]:
    """What a cell was computed under (a kept cell is reused only under the same)."""
    return {
        "engine": engine,
        "n_clients": n_clients,
        "rows": args.rows,
        "features": args.features,
        "components": args.components,
        "ray_cpus": args.ray_cpus if engine == "flower-sim" else None,
    }


def run_cell(args: argparse.Namespace, engine: str, n_clients: int) -> dict[str, Any]:
    """One engine on one federation: seconds per round, wall time, fitted parameters."""
    from fednovelty.runtime import run_simulation
    from fednovelty.runtime.flower.sim_engine import run_flower_simulation

    clients = federation(n_clients, args.rows, args.features, args.components)
    run = run_simulation if engine == "in-process" else run_flower_simulation
    load_before = os.getloadavg()
    started = time.perf_counter()
    result = run(algorithm(args.components), clients, random_state=0, progress=False)
    wall = time.perf_counter() - started
    params = result.state.params
    return {
        "settings": settings_of(args, engine, n_clients),
        "kinds": [r.kind for r in result.history],
        "round_seconds": [r.seconds for r in result.history],
        "wall_seconds": wall,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "params": {
            "weights": params.weights.tolist(),
            "means": params.means.tolist(),
            "precisions_cholesky": params.precisions_cholesky.tolist(),
        },
    }


def cell_path(folder: Path, engine: str, n_clients: int) -> Path:
    return folder / f"{engine}_{n_clients}.json"


def load_cell(folder: Path, args: argparse.Namespace, engine: str, n: int) -> dict | None:
    """The kept cell of ``engine`` at ``n`` clients, if computed under these settings."""
    path = cell_path(folder, engine, n)
    if not path.exists():
        return None
    cell = json.loads(path.read_text())
    return cell if cell.get("settings") == settings_of(args, engine, n) else None


def per_client(cell: dict) -> float:
    """Seconds per client of a warm round (rounds after the first; the only round else)."""
    seconds = cell["round_seconds"]
    warm = seconds[1:] or seconds
    return float(np.mean(warm)) / cell["settings"]["n_clients"]


def delivery_pass(n: int, stride: int) -> dict[str, float]:
    """Seconds of one pass of Flower's simulation over ``n`` virtual nodes with one message
    each, measured on Flower's own in-memory LinkState: every node asks for its message
    (``get_message_ins(node, limit=1)``, as the Simulation Engine's message extractor does
    every 0.1 s), and node ``k``'s request checks the ``k`` stored messages before its own,
    so a pass grows as ``n**2``. Every ``stride``-th node is asked (the others' messages stay
    stored, so each asked node checks as many as in a full pass); the pass is their time
    times ``stride``."""
    from typing import cast

    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.proto.task_pb2 import Task
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    state = cast(InMemoryLinkState, factory.state())
    run = Run.create_empty(run_id=1)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state.run_ids[1] = RunRecord(run=run)
    state.task_store[1] = Task(task_id=1, run_id=1)
    nodes = list(_register_nodes(n, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    content = RecordDict({"c": ConfigRecord({"a": 1})})
    grid.push_messages(
        [Message(content, dst_node_id=node, message_type="train", group_id="1") for node in nodes]
    )
    asked = nodes[::stride]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    for node in asked:
        state.get_message_ins(node_id=node, limit=1)
    seconds = (time.perf_counter() - started) * stride
    return {"n_clients": n, "stride": stride, "seconds": seconds, "load": load}


def projection(cells: dict, passes: dict, n: int, rounds: int) -> dict[str, float] | None:
    """Seconds a flower-sim cell of ``n`` clients would take, two ways: a lower bound, each
    round one measured delivery pass at ``n`` plus ``n`` times the per-client cost of the
    smallest flower-sim cell (where the pass is negligible); and the power law through the
    warm rounds of the two largest cells measured."""
    measured = sorted(
        (c for (e, m), c in cells.items() if e == "flower-sim" and m < n),
        key=lambda c: c["settings"]["n_clients"],
    )
    if not measured or n not in passes:
        return None
    low = rounds * (passes[n]["seconds"] + per_client(measured[0]) * n)
    out = {"lower": low}
    if len(measured) >= 2:
        (a, b) = measured[-2:]
        na, nb = a["settings"]["n_clients"], b["settings"]["n_clients"]
        wa, wb = per_client(a) * na, per_client(b) * nb
        power = float(np.log(wb / wa) / np.log(nb / na))
        out.update({"power": power, "fitted": rounds * wb * (n / nb) ** power})
    return out


def max_relative_difference(a: dict, b: dict) -> float:
    """Largest ``|a - b|`` over the parameters, relative to each tensor's largest ``|a|``."""
    worst = 0.0
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-300)))
    return worst


def machine() -> str:
    """CPU model and cores of this machine."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def report(args: argparse.Namespace, cells: dict, passes: dict, projected: dict) -> str:
    """The Markdown report of every cell kept under these settings."""
    import flwr
    import ray
    import torch

    version = getattr(flwr, "__version__", "")
    lines = [
        "# Flower's Simulation Engine at scale (`benchmarks/flower_sim_scale.py`)",
        "",
        f"FederatedEM, K = {args.components}, {args.features} features, {args.rows} rows per "
        "client, rounds `centroids`, `assign`, `em` (one k-means round, one EM round); "
        f"flower-sim on Ray with {args.ray_cpus} CPUs, one CPU per ClientApp actor. "
        f"Machine: {machine()}; flwr {version}, ray {ray.__version__}, torch "
        f"{torch.__version__}.",
        "",
        "Seconds per round: round 1 apart (flower-sim: it includes starting the actors), then "
        "the mean of rounds 2-3 (warm); per client: the warm mean over the clients. Max rel. "
        "diff: the largest difference between the two engines' fitted weights, means and "
        "precision factors, relative to each tensor's largest magnitude. Load: the 1-minute "
        "load average before and after the cell.",
        "",
        "| clients | engine | round 1 s | warm s/round | ms per client | wall s | load | "
        "max rel. diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in sorted({m for _, m in cells} | set(projected)):
        inproc = cells.get(("in-process", n))
        for engine in ENGINES:
            cell = cells.get((engine, n))
            if cell is None:
                guess = projected.get(n) if engine == "flower-sim" else None
                if guess is not None:
                    fitted = guess.get("fitted")
                    shown = f">= {guess['lower'] / 3:.0f}" + (
                        f", ~{fitted / 3:.0f}" if fitted is not None else ""
                    )
                    lines.append(
                        f"| {n:,} | flower-sim | - | **projection: {shown}** | - | "
                        f"**projection: >= {guess['lower']:.0f}** | - | not run |"
                    )
                continue
            seconds = cell["round_seconds"]
            warm = float(np.mean(seconds[1:] or seconds))
            diff = "-"
            if engine == "flower-sim" and inproc is not None:
                diff = f"{max_relative_difference(inproc['params'], cell['params']):.1e}"
            load = f"{cell['load_before'][0]:.1f}-{cell['load_after'][0]:.1f}"
            lines.append(
                f"| {n:,} | {engine} | {seconds[0]:.2f} | {warm:.3f} | "
                f"{1000 * per_client(cell):.2f} | {cell['wall_seconds']:.1f} | {load} | {diff} |"
            )
    ratios = []
    for n in sorted({m for _, m in cells}):
        a, b = cells.get(("in-process", n)), cells.get(("flower-sim", n))
        if a is not None and b is not None:
            slow = np.mean(b["round_seconds"][1:]) / np.mean(a["round_seconds"][1:])
            ratios.append(f"{n:,} clients: flower-sim / in-process warm round = {slow:.0f}x")
    lines += ["", *(f"- {r}" for r in ratios)]
    if passes:
        lines += [
            "",
            "Where the time goes at scale: one delivery pass of Flower's Simulation Engine over "
            "its in-memory LinkState (every virtual node asks for its message; node k's request "
            "checks the k stored messages before its own, so a pass grows as n squared; "
            "measured with Flower's own classes, every stride-th node asked, the pass their "
            "time times the stride):",
            "",
            "| clients | stride | one delivery pass s | load |",
            "|---|---|---|---|",
            *(
                f"| {n:,} | {p['stride']} | {p['seconds']:.2f} | {p['load']:.1f} |"
                for n, p in sorted(passes.items())
            ),
        ]
    if projected:
        lines += [
            "",
            "A **projection** is not a measurement. `>=`: a lower bound, each round one "
            "measured delivery pass at that size plus the clients times the per-client cost of "
            "the smallest flower-sim cell; `~`: the power law through the warm rounds of the "
            "two largest cells measured"
            + "".join(
                f" (n^{g['power']:.2f})" for g in list(projected.values())[:1] if "power" in g
            )
            + f". Not run because its 3 rounds' projection (the power law's, else the lower "
            f"bound) is above --budget {args.budget:.0f} s (or with --report-only).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--components", type=int, default=4)
    parser.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.rows = [10, 30], 20
    folder = args.out / "flower_sim_scale_cells"
    folder.mkdir(parents=True, exist_ok=True)
    cells, passes, projected = {}, {}, {}
    ray_started = False
    for n in sorted(args.clients):
        probe = folder / f"linkstate_{n}.json"
        if probe.exists():
            passes[n] = json.loads(probe.read_text())
        elif not args.report_only:
            passes[n] = delivery_pass(n, max(1, n // 50))
            probe.write_text(json.dumps(passes[n]))
        for engine in ENGINES:
            cell = load_cell(folder, args, engine, n)
            if cell is None and engine == "flower-sim":
                guess = projection(cells, passes, n, 3)
                estimate = None if guess is None else guess.get("fitted", guess["lower"])
                if guess is not None and (args.report_only or estimate > args.budget):
                    projected[n] = guess
                    print(f"{engine} {n}: projected {guess}; not run", flush=True)
                    continue
            if cell is None and not args.report_only:
                if engine == "flower-sim" and not ray_started:
                    import ray

                    ray.init(num_cpus=args.ray_cpus, include_dashboard=False,
                             logging_level="WARNING")  # fmt: skip
                    ray_started = True
                print(f"{engine} {n}: running", flush=True)
                cell = run_cell(args, engine, n)
                cell_path(folder, engine, n).write_text(json.dumps(cell))
            if cell is not None:
                cells[(engine, n)] = cell
                print(
                    f"{engine} {n}: rounds {[round(s, 3) for s in cell['round_seconds']]} s, "
                    f"wall {cell['wall_seconds']:.1f} s",
                    flush=True,
                )
    name = "flower_sim_scale.md"
    (args.out / name).write_text(report(args, cells, passes, projected))
    print(f"report: {args.out / name}")


if __name__ == "__main__":
    main()
