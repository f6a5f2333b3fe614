"""A round's clients as one batched computation against one client after another.

FedGMM's joint model on FEMNIST writers, as ``fedgmm_femnist.py`` trains it (the shifted
writers, images standardised, 2 Gaussians on 24 federated principal axes, 2 learners, 3
local epochs of SGD at 0.2 in batches of 32, float32): the same fit with
``batch_clients=False`` (each client's learners trained one after another, as Flower nodes
run them) and ``batch_clients=True`` (every client's learners stacked and trained under one
``torch.func.vmap`` per step), timed back to back, alone and beside ``--busy`` busy torch
processes (``bench_threads.py``'s load), with the caller's torch threads at each of
``--threads`` (default 1; learner SGD runs on one thread either way unless
``FEDNOVELTY_NUM_THREADS`` says otherwise). Both fits give the same
model: the script prints the largest relative difference of their learners and their test
accuracy (each writer's own weights).

Run ``python -m benchmarks.clients_parallel`` (100 writers, 5 rounds, MLP learners),
``--learner cnn`` (the paper's CNN; its first round costs minutes a writer hundred on CPU),
``--writers N --rounds R``, ``--device cuda`` (no load section there), ``--quick`` (8
writers, 1 round), ``--out FILE``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from benchmarks.bench_threads import busy_processes, load_line
from benchmarks.common import (
    add_device,
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
from benchmarks.fedgmm_femnist import Settings, make_model


def timed_fit(data, settings: Settings, threads: int) -> tuple[float, object]:
    """Seconds of one FedGMM fit of ``data``'s training rows under ``settings`` with the
    caller's torch threads set to ``threads``; the fitted detector."""
    torch.set_num_threads(threads)
    model = make_model("FedGMM", settings, seed=0)
    started = time.perf_counter()
    model.fit(data.X_train, data.y_train, data.groups_train)
    if settings.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started, model


def learner_gap(a, b) -> float:
    """Largest difference of two fits' learners, relative to the weights' scale."""
    first, second = a.joint_state_.learners, b.joint_state_.learners
    scale = max(float(v.abs().max()) for p in first for v in p.values())
    gap = max(
        float((p[k] - q[k]).abs().max()) for p, q in zip(first, second, strict=True) for k in p
    )
    return gap / max(1.0, scale)


def run(args) -> tuple[list[str], str]:
    base = Settings(args.writers, args.rounds, (0,), learner=args.learner, device=args.device)
    data = standardised(shifted_writers(base.n_writers, 0))
    settings = {mode: dataclasses.replace(base, batch_clients=mode) for mode in (False, True)}
    timed_fit(data, dataclasses.replace(base, max_iter=1), 1)  # imports, caches
    loaded = args.device == "cpu" and args.busy > 0
    conditions = [("alone", 0)] + ([("loaded", args.busy)] if loaded else [])
    rows = []
    for condition, busy in conditions:
        for threads in args.threads:
            with busy_processes(busy):
                before = load_line()
                one, one_model = timed_fit(data, settings[False], threads)
                many, many_model = timed_fit(data, settings[True], threads)
            accuracy = [
                personal_accuracy(m, data.X_test, data.y_test, data.groups_test)
                for m in (one_model, many_model)
            ]
            rows.append(
                f"| {condition} ({before}) | {threads} | {one:.1f} | {many:.1f} | "
                f"{one / many:.2f}x | {accuracy[0]:.2f} / {accuracy[1]:.2f} | "
                f"{learner_gap(one_model, many_model):.1e} |"
            )
            print(rows[-1], flush=True)
    return rows, base.describe()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--learner", choices=("linear", "mlp", "cnn"), default="mlp")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--busy", type=int, default=2)
    add_device(parser)
    add_out(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.writers, args.rounds, args.threads, args.busy = 8, 1, [1], 0
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    device = device_facts(args.device)
    command = command_line("clients_parallel", argv)
    started = time.perf_counter()
    rows, scale = run(args)
    header = report_header(
        "Clients in parallel: FedGMM's joint rounds batched against one client at a time",
        command,
        args.quick,
        time.perf_counter() - started,
    )
    table = [
        "| condition | threads | one at a time s | batched s | speed-up | accuracy % "
        "(one / batched) | learners' relative gap |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    body = [header, f"- device: {device}; scale: {scale}", "", *table]
    return emit_report("\n".join(body) + "\n", args.out)


if __name__ == "__main__":
    main()
