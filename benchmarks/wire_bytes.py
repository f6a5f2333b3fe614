"""Bytes per client per round on the wire: raw, packed, packed with float32, and the cost of
float32 on the wire for federated EM.

Data: ADBench Forest Covertype (``make_task("10_cover", "novelty", n_clients=3, alpha=0.5,
seed=0, max_train=9000)``: 10 min-max scaled features, three Dirichlet(0.5) clients of a few
thousand rows each; the joint model's classes are the task's 10 k-means groups). Algorithms
(``random_state=0``): ``FederatedEM`` with ``K = 10`` full and diagonal covariances (k-means
init), ``FedGenGMM`` (``k_range=(1, 10)``), ``FederatedVB`` (``K = 10``) and ``JointFedGMM``
(``K = 10``, one learner, 10 classes, 10 EM rounds).

Each algorithm runs twice through the shared round loop with an in-process transport that
records every message as it crosses: once with ``wire_dtype=None`` and once with
``"float32"``. Per round kind, bytes per client per round (``Message.nbytes()``: tensor bytes
plus 8 a scalar, a string's UTF-8 length) of each reply (up) and of the broadcast (down):
**raw** (the message before packing, ``wire.unpack`` of what crossed, float64), **packed**
(what crossed with ``wire_dtype=None``: exact), **packed + f32** (what crossed with
``wire_dtype="float32"``), and **if symmetric**: the packed size had each second moment been
sent with its two triangles equal to the bit (``(S + S^T) / 2`` before packing; a GEMM leaves
them a few ulps apart, so today they travel whole). Ratios are against raw.

Second section: the float32 wire's cost for ``FederatedEM`` full on the same data (tol 1e-3,
at most 100 rounds): EM rounds run, the final mean log-likelihood of the training rows, the
test AUROC (novel = positive, score ``-log p(x)``) of each run and their differences, and the
largest difference of the final means relative to their scale.

``python -m benchmarks.wire_bytes [--out PATH]`` (default ``benchmarks/wire_bytes.txt``);
one torch thread; about 1 minute.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import add_out, emit_report, report_header
from fednovelty.datasets.protocols import make_task
from fednovelty.evaluation.metrics import auroc
from fednovelty.federated import (
    FederatedEM,
    FederatedVB,
    FedGenGMM,
    JointFedGMM,
    Message,
    PrivacyPolicy,
)
from fednovelty.federated.core.wire import pack, unpack
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.reply_form import is_skipped
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.mixture.model import score_samples
from fednovelty.runtime import loop
from fednovelty.runtime.simulation import InProcessTransport

K = 10


def symmetrized(message: Message) -> Message:
    """``message`` with every floating (..., d, d) tensor whose triangles agree to 1e-12 of
    its scale replaced by ``(T + T^T) / 2`` (exactly symmetric)."""
    tensors = {}
    for name, t in message.tensors.items():
        square = t.ndim >= 2 and t.shape[-1] == t.shape[-2] >= 2 and t.is_floating_point()
        if square and float((t - t.mT).abs().amax()) <= 1e-12 * float(t.abs().amax()):
            t = (t + t.mT) / 2
        tensors[name] = t
    return Message(message.kind, tensors, dict(message.scalars))


class Metered(InProcessTransport):
    """An in-process transport that records, per round, the broadcast's and each reply's
    bytes as they crossed and as raw float64 messages."""

    def __init__(self, *args, wire_dtype=None) -> None:
        super().__init__(*args)
        self.wire_dtype, self.rounds = wire_dtype, []

    def exchange(self, number: int, message: Message) -> loop.Delivery:
        delivery = super().exchange(number, message)
        replies = [r for r in delivery.replies.values() if not is_skipped(r)]
        wide = [unpack(r, torch.float64) for r in replies]
        self.rounds.append(
            {
                "kind": message.kind,
                "down_raw": unpack(message, torch.float64).nbytes(),
                "down": message.nbytes(),
                "up_raw": [r.nbytes() for r in wide],
                "up": [r.nbytes() for r in replies],
                "up_sym": [pack(symmetrized(r), self.wire_dtype).nbytes() for r in wide],
            }
        )
        return delivery


def run(algorithm, data: dict[int, object], width: int, wire_dtype):
    contexts = {c: gate.client_context(c, policy=PrivacyPolicy(), wire=True) for c in data}
    transport = Metered(
        algorithm, data, contexts, 1.0, 0.0, np.random.default_rng(0), wire_dtype=wire_dtype
    )
    state, _ = loop.run_rounds(algorithm, transport, validator=ReplyValidator(n_features=width))
    return state, transport.rounds


def per_kind(rounds: list[dict]) -> dict[str, dict[str, float]]:
    """Round kind -> mean bytes per client per round of each column, and the round count."""
    grouped: dict[str, list[dict]] = defaultdict(list)
    for r in rounds:
        grouped[r["kind"]].append(r)
    out = {}
    for kind, rs in grouped.items():
        ups = {key: [v for r in rs for v in r[key]] for key in ("up_raw", "up", "up_sym")}
        out[kind] = {
            "rounds": len(rs),
            **{key: float(np.mean(v)) if v else 0.0 for key, v in ups.items()},
            "down_raw": float(np.mean([r["down_raw"] for r in rs])),
            "down": float(np.mean([r["down"] for r in rs])),
        }
    return out


def algorithms(wire_dtype):
    common = {"random_state": 0, "wire_dtype": wire_dtype}
    return {
        "FederatedEM full": FederatedEM(K, covariance_type="full", **common),
        "FederatedEM diag": FederatedEM(K, covariance_type="diag", **common),
        "FedGenGMM": FedGenGMM(n_components=K, k_range=(1, K), **common),
        "FederatedVB": FederatedVB(K, **common),
        "JointFedGMM": JointFedGMM(K, 1, 10, max_iter=10, **common),
    }


def fmt(x: float) -> str:
    return f"{x:,.0f}"


def bytes_table(task) -> tuple[list[str], dict]:
    rows = [torch.as_tensor(task.X_train[task.groups_train == c]) for c in range(3)]
    labels = [torch.as_tensor(task.partition_labels[task.groups_train == c]) for c in range(3)]
    width = rows[0].shape[1]
    lines = [
        "| algorithm | round | rounds | up raw | up packed | up packed+f32 | up if symmetric | "
        "packed/raw | packed+f32/raw | symmetric/raw | down raw | down packed | "
        "down packed+f32 | packed/raw | packed+f32/raw |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    run_lines = [
        "",
        "Whole run, bytes per client (up + down, every round):",
        "",
        "| algorithm | raw | packed | packed+f32 | if symmetric | packed/raw | packed+f32/raw "
        "| symmetric/raw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    states = {}
    for name in algorithms(None):
        measured = {}
        for wire in (None, "float32"):
            algorithm = algorithms(wire)[name]
            data = dict(enumerate(zip(rows, labels, strict=True) if algorithm.labelled else rows))
            state, rounds = run(algorithm, data, width, wire)
            measured[wire] = per_kind(rounds)
            states[(name, wire)] = state
        wide, narrow = measured[None], measured["float32"]
        totals = {
            key: sum(m["rounds"] * (m[up] + m[down]) for m in ms.values())
            for key, ms, up, down in (
                ("raw", wide, "up_raw", "down_raw"),
                ("packed", wide, "up", "down"),
                ("f32", narrow, "up", "down"),
                ("sym", wide, "up_sym", "down"),
            )
        }
        run_lines.append(
            f"| {name} | {fmt(totals['raw'])} | {fmt(totals['packed'])} | {fmt(totals['f32'])} | "
            f"{fmt(totals['sym'])} | {totals['packed'] / totals['raw']:.2f} | "
            f"{totals['f32'] / totals['raw']:.2f} | {totals['sym'] / totals['raw']:.2f} |"
        )
        for kind, m in wide.items():
            n32 = narrow.get(kind)
            up32 = n32["up"] if n32 else float("nan")
            down32 = n32["down"] if n32 else float("nan")
            up_raw, down_raw = m["up_raw"] or float("nan"), m["down_raw"] or float("nan")
            lines.append(
                f"| {name} | {kind} | {m['rounds']} | {fmt(m['up_raw'])} | {fmt(m['up'])} | "
                f"{fmt(up32)} | {fmt(m['up_sym'])} | {m['up'] / up_raw:.2f} | "
                f"{up32 / up_raw:.2f} | {m['up_sym'] / up_raw:.2f} | {fmt(m['down_raw'])} | "
                f"{fmt(m['down'])} | {fmt(down32)} | {m['down'] / down_raw:.2f} | "
                f"{down32 / down_raw:.2f} |"
            )
    return lines + run_lines, states


def float32_cost(task, states) -> list[str]:
    X_train = torch.as_tensor(task.X_train)
    X_test = torch.as_tensor(task.X_test)
    lines = [
        "| wire | EM rounds | mean log-likelihood (train) | test AUROC |",
        "|---|---|---|---|",
    ]
    figures = {}
    for wire in (None, "float32"):
        state = states[("FederatedEM full", wire)]
        params = state.params
        loglik = float(score_samples(params, X_train).mean())
        scores = -score_samples(params, X_test).numpy()
        figures[wire] = (params, loglik, auroc(task.y_test, scores))
        lines.append(
            f"| {'float64' if wire is None else 'float32'} | {state.n_iter} | {loglik:.6f} | "
            f"{figures[wire][2]:.6f} |"
        )
    (p64, l64, a64), (p32, l32, a32) = figures[None], figures["float32"]
    gap = float((p32.means - p64.means).abs().amax() / p64.means.abs().amax())
    lines += [
        "",
        f"float32 - float64: mean log-likelihood {l32 - l64:+.2e}, AUROC {a32 - a64:+.2e}; "
        f"largest difference of the final means {gap:.2e} of their scale.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(parser, default=Path(__file__).with_name("wire_bytes.txt"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    task = make_task("10_cover", "novelty", n_clients=3, alpha=0.5, seed=0, max_train=9000)
    sizes = [int((task.groups_train == c).sum()) for c in range(3)]
    table, states = bytes_table(task)
    cost = float32_cost(task, states)
    seconds = time.perf_counter() - started
    report = "\n".join(
        [
            report_header(
                "Bytes per client per round on the wire",
                "python -m benchmarks.wire_bytes",
                False,
                seconds,
            ),
            "",
            f"Covertype (10 features), 3 Dirichlet(0.5) clients of {sizes} rows; K = {K}. "
            "Bytes per client per round (mean over the rounds of each kind): raw = the message "
            "before packing (float64); packed = what crossed (exact); packed+f32 = what "
            "crossed with wire_dtype='float32'; if symmetric = packed had each second moment's "
            "triangles been equal to the bit. Down: the broadcast to one client.",
            "",
            *table,
            "",
            "## float32 on the wire: FederatedEM full, K = 10",
            "",
            *cost,
        ]
    )
    emit_report(report + "\n", args.out)


if __name__ == "__main__":
    main()
