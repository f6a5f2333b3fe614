"""VGM2's Table 1 where data exists: MNIST label shards and FEMNIST writers.

Methods, all one code path and one encoder (:class:`fednovelty.detectors.vgm2.VGM2Classifier`,
``--encoder``): Local, FedAvg, Prototype sharing (FedProto), VGM2 with moment
matching (Prop. 1, the default) and with natural-parameter averaging (Sec. 3.5), and the
ablations the paper describes in words: K = 1 marker component, no calibration term, frozen
encoder (markers trained, encoder left at its initial weights).

Setting (the paper's Sec. 5 where it says): N = 30 clients, T = 100 rounds, 2 clients per
round, E = 8 local epochs, Adam, B = 15 calibration bins, 3 seeds.
- MNIST: the training split cut into label shards (:func:`~fednovelty.datasets.partition.
  shard_partition`, S = 2 shards per client, McMahan's choice; the paper does not give S);
  each client's shard rows are shuffled and ``--max-rows`` of them (default 200) train,
  a further quarter as many (50) are its test rows (same label distribution).
- FEMNIST: 30 real writers (``make_femnist_federated``; each writer's images 60/20/20),
  at most ``--max-rows`` training images each, tested on the writer's test images.
- CPU budget: ``--max-rows`` caps each client's training rows (the paper's MNIST shards hold
  2000); everything else is the paper's but the encoder.
- Encoder (``--encoder``, at every scale): ``mlp`` (the default), ``784 -> 128 -> 16``;
  ``convnet``, VGM2Classifier's ``encoder="convnet"``: two 5x5 convolutions (16 and 32
  channels, each with ReLU and 2x2 pooling), a dense layer of 128 and the 16-wide embedding,
  for the paper's "small ConvNet" on MNIST (the paper gives no layers, so these are ours).

Scales (the report names the one it ran): ``--quick`` (seconds); the default CPU scale (at most
200 training rows per client); ``--paper-scale``: at most 2,000 training rows per client, the
size of the paper's MNIST shards (a client's 2 shards of our 60,000 training images hold 2,000
rows, of which a fifth, 400, become its test rows and 1,600 train; FEMNIST writers hold fewer
than 2,000 images, so all of a writer's training images), for a GPU with ``--device
cuda``, or on a CPU over several sessions (below). ``--device cpu|cuda`` is where every model
trains and predicts.

Resuming: every finished cell (one dataset x variant x seed) is kept in ``--checkpoints``
(default ``<out-dir>/cells``; :mod:`benchmarks.checkpoints`: one pickle per cell,
``<dataset>-<variant>-seed<k>.pkl``, holding its record and the settings, commit and date it
ran under). A later run with the same settings (clients, rounds, clients per round, epochs,
rows, device, encoder and the variants' definitions) reads finished cells back, prints
``resumed <cell>`` and does not fit them again (their seconds are the original fit's); a cell
kept under other settings is computed again. A run cut short therefore loses at most the
cell it was fitting; ``--variants`` and ``--seeds`` may differ between sessions, and a last run
with all of them writes the whole table from the kept cells. The report ends with how many
cells were read back and computed.

Metric: per-client macro-F1 over the labels present in the client's test rows, averaged over
the 30 clients (the usual personalised protocol; the paper says only "test F1"), mean +- std
over seeds; accuracy the same way. Bytes: a client's upload per round as measured from the
messages (tensors plus 8 bytes per scalar) next to the paper's arithmetic.

Usage::

    python -m benchmarks.vgm2_table1                       # full run (long)
    python -m benchmarks.vgm2_table1 --quick               # smoke (seconds)
    python -m benchmarks.vgm2_table1 --datasets mnist --seeds 1 --rounds 30
    python -m benchmarks.vgm2_table1 --paper-scale --device cuda   # on a GPU
    python -m benchmarks.vgm2_table1 --paper-scale --encoder convnet --datasets mnist
        # on a CPU: rerun the same command in later sessions until every cell is kept

Writes ``vgm2_table1.md`` (under a header with the scale, encoder, device, date and wall
time), ``vgm2_table1.csv`` and ``vgm2_table1.json`` to ``--out-dir`` (default
``benchmarks/results/vgm2/``; ``benchmarks/results/vgm2_paper_scale/`` with
``--paper-scale``; ``_convnet`` appended to either with ``--encoder convnet``), the tidy files
after every cell.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import f1_score

from benchmarks.checkpoints import Checkpoints, cached, settings_signature
from benchmarks.common import (
    Experiment,
    PaperTables,
    add_checkpoints,
    add_device,
    check_device,
    command_line,
    device_facts,
    mean_std,
    run_paper_tables,
    with_options,
)
from fednovelty.datasets.loaders import load_mnist
from fednovelty.datasets.partition import shard_partition

OUT = Path(__file__).resolve().parent / "results" / "vgm2"
OUT_PAPER_SCALE = Path(__file__).resolve().parent / "results" / "vgm2_paper_scale"
#: Training rows per client at each scale (``--max-rows``); the paper's MNIST shards: 2,000.
MAX_ROWS = {"quick": 40, "cpu": 200, "paper": 2000}
#: the encoders (``--encoder``, VGM2Classifier's ``encoder``) as the report names them.
ENCODERS = {
    "mlp": "an MLP encoder 784 -> 128 -> 16",
    "convnet": "a ConvNet encoder (5x5 convolutions of 16 and 32 channels, each pooled 2x2; "
    "dense 128 -> 16)",
}

#: the paper's Table 1, MNIST column (test F1, mean over 3 seeds).
PAPER_MNIST = {"Local": 0.703, "FedAvg": 0.871, "Prototype sharing": 0.842, "VGM2": 0.909}

#: variant name -> VGM2Classifier settings.
VARIANTS: dict[str, dict] = {
    "Local": {"method": "local"},
    "FedAvg": {"method": "fedavg"},
    "Prototype sharing": {"method": "prototype"},
    "VGM2": {"method": "vgm2", "posterior_merge": "moment"},
    "VGM2 (natural)": {"method": "vgm2", "posterior_merge": "natural"},
    "VGM2, K = 1": {"method": "vgm2", "n_markers": 1},
    "VGM2, no calibration": {"method": "vgm2", "calibration_weight": 0.0},
    "VGM2, frozen encoder": {"method": "vgm2", "train_encoder": False},
}
PAPER_KEY = {
    "VGM2": "VGM2",
    "Local": "Local",
    "FedAvg": "FedAvg",
    "Prototype sharing": "Prototype sharing",
}


@dataclass
class Split:
    """One federated dataset: per-client training and test rows and labels."""

    name: str
    train: list[tuple[np.ndarray, np.ndarray]]
    test: list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Settings:
    """One run's scale: clients, rounds, clients per round, local epochs, training rows per
    client, device, variants, seeds, the scale's name, the tidy files' folder, the encoder
    and the kept cells (``None``: none kept); ``records`` gathers every cell's record for the
    tidy files."""

    clients: int
    rounds: int
    per_round: int
    epochs: int
    max_rows: int
    device: str
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    scale: str
    out_dir: Path
    encoder: str = "mlp"
    checkpoints: Checkpoints | None = None
    records: list[dict] = field(default_factory=list)


def cell_signature(settings: Settings) -> str:
    """What a cell's result depends on beside its dataset, variant and seed (its key): the
    federation's size, rounds, epochs, rows, device, encoder and every variant's definition
    (:data:`VARIANTS`, whichever ``--variants`` run)."""
    return settings_signature(
        {
            "clients": settings.clients,
            "rounds": settings.rounds,
            "per_round": settings.per_round,
            "epochs": settings.epochs,
            "max_rows": settings.max_rows,
            "device": settings.device,
            "encoder": settings.encoder,
            "variants": VARIANTS,
        }
    )


def cell_key(dataset: str, variant: str, seed: int) -> str:
    """A cell's checkpoint name: ``MNIST-VGM2_K_=_1-seed0`` (characters other than letters,
    digits and ``=+.-`` become ``_``)."""
    name = re.sub(r"[^A-Za-z0-9=+.-]+", "_", variant).strip("_")
    return f"{dataset}-{name}-seed{seed}"


def mnist_shards(n_clients: int, max_rows: int, seed: int) -> Split:
    """MNIST's training split in label shards (S = 2); per client ``max_rows`` training
    rows and ``max_rows // 4`` test rows from its shards."""
    raw = load_mnist()
    X = raw["x_train"].reshape(-1, 784).astype(np.float32) / 255.0
    y = raw["y_train"]
    rng = np.random.default_rng(seed)
    train, test = [], []
    for part in shard_partition(y, n_clients, 2, random_state=seed):
        rows = rng.permutation(part)
        n_test = max(1, min(max_rows // 4, rows.size // 5))
        n_train = min(max_rows, rows.size - n_test)
        train.append((X[rows[:n_train]], y[rows[:n_train]]))
        test.append((X[rows[n_train : n_train + n_test]], y[rows[n_train : n_train + n_test]]))
    return Split("MNIST", train, test)


def femnist_writers(n_clients: int, max_rows: int, seed: int) -> Split:
    """FEMNIST's writers as clients (60/20/20 per writer), at most ``max_rows`` training
    images each, tested on the writer's test images."""
    from fednovelty.datasets.femnist import make_femnist_federated

    data = make_femnist_federated(n_clients, random_state=seed)
    X_tr = data.X_train.astype(np.float32)
    X_te = data.X_test.astype(np.float32)
    train, test = [], []
    for c in range(n_clients):
        tr = np.flatnonzero(data.groups_train == c)[:max_rows]
        te = np.flatnonzero(data.groups_test == c)
        train.append((X_tr[tr], data.y_train[tr]))
        test.append((X_te[te], data.y_test[te]))
    return Split("FEMNIST", train, test)


DATASETS = {"mnist": mnist_shards, "femnist": femnist_writers}


def seed_split(make, settings: Settings, seed: int) -> Split:
    """A seed's split by ``make`` (a :data:`DATASETS` function) at ``settings``' scale."""
    return make(settings.clients, settings.max_rows, seed)


def personal_scores(model, split: Split, client_ids: np.ndarray) -> tuple[float, float]:
    """Mean over clients of the macro-F1 (labels present in the client's test rows) and of
    the accuracy, each client predicted with its own model."""
    f1s, accs = [], []
    for c, (X, y) in zip(client_ids, split.test, strict=True):
        pred = model.predict_y(X, client=int(c))
        f1s.append(f1_score(y, pred, labels=np.unique(y), average="macro", zero_division=0))
        accs.append(float(np.mean(pred == y)))
    return float(np.mean(f1s)), float(np.mean(accs))


def run_one(split: Split, variant: str, seed: int, settings: Settings) -> dict:
    """Fit one variant on one split; its record (F1, accuracy, bytes, seconds)."""
    from fednovelty.detectors.vgm2 import VGM2Classifier

    X = np.concatenate([x for x, _ in split.train])
    y = np.concatenate([t for _, t in split.train])
    groups = np.concatenate([np.full(len(t), c) for c, (_, t) in enumerate(split.train)])
    params = {
        "rounds": settings.rounds,
        "clients_per_round": settings.per_round,
        "local_epochs": settings.epochs,
        "random_state": seed,
        "device": settings.device,
        "encoder": settings.encoder,
        **VARIANTS[variant],
    }
    start = time.perf_counter()
    model = VGM2Classifier(**with_options(params)).fit(X, y, groups)
    f1, acc = personal_scores(model, split, model.client_ids_)
    seconds = time.perf_counter() - start
    f1_top = acc_top = float("nan")
    if model.method == "vgm2":  # the first rule tried, on the same fitted model
        f1_top, acc_top = personal_scores(
            model.set_params(prediction="top_pi"), split, model.client_ids_
        )
    return {
        "dataset": split.name,
        "variant": variant,
        "seed": seed,
        "macro_f1": f1,
        "accuracy": acc,
        "macro_f1_top_pi": f1_top,
        "accuracy_top_pi": acc_top,
        "bytes_per_client_round": model.bytes_per_client_round_,
        "seconds": seconds,
        "rounds": settings.rounds,
        "max_rows": settings.max_rows,
        "never_sampled": int(np.sum(model.sampled_counts_ == 0)),
        "encoder": settings.encoder,
    }


_mean_std = partial(mean_std, digits=3, ddof=0, sep=" +- ")  # population std (ddof 0)


def run_split(split: Split, settings: Settings, seed: int) -> list[dict]:
    """Every variant of ``settings`` on one seed's split; their records, each also added to
    ``settings.records`` and the tidy files rewritten after it. A cell kept in
    ``settings.checkpoints`` under the same settings is read back, not fitted."""
    out = []
    for variant in settings.variants:
        record = cached(
            settings,
            cell_key(split.name, variant, seed),
            partial(run_one, split, variant, seed, settings),
        )
        out.append(record)
        settings.records.append(record)
        print(json.dumps(record), flush=True)
        write_tidy(settings.records, settings.out_dir)
    return out


def write_tidy(records: list[dict], out_dir: Path) -> None:
    """``vgm2_table1.json`` (the records) and ``vgm2_table1.csv`` (one row per record)."""
    (out_dir / "vgm2_table1.json").write_text(json.dumps(records, indent=1))
    keys = list(records[0])
    csv = [",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in records]
    (out_dir / "vgm2_table1.csv").write_text("\n".join(csv) + "\n")


def dataset_table(per_seed: list[list[dict]], settings: Settings) -> str:
    """One dataset's section: a row per variant run, mean +- std over seeds."""
    rows = [r for records in per_seed for r in records]
    dataset = rows[0]["dataset"]
    lines = [
        f"## {dataset}",
        "",
        "| method | macro-F1 | accuracy | seeds | paper F1 (MNIST) | macro-F1, top-pi rule "
        "| bytes/client/round | seconds/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        paper = PAPER_MNIST.get(PAPER_KEY.get(variant, ""), None)
        tops = [r["macro_f1_top_pi"] for r in mine if r["macro_f1_top_pi"] == r["macro_f1_top_pi"]]
        top_text = _mean_std(tops)
        paper_text = f"{paper:.3f}" if paper is not None and dataset == "MNIST" else "-"
        lines.append(
            f"| {variant} | {_mean_std([r['macro_f1'] for r in mine])} | "
            f"{_mean_std([r['accuracy'] for r in mine])} | {len(mine)} | {paper_text} | "
            f"{top_text} | "
            f"{np.mean([r['bytes_per_client_round'] for r in mine]):.0f} | "
            f"{np.mean([r['seconds'] for r in mine]):.0f} |"
        )
    return "\n".join(lines)


def facts(settings: Settings) -> str:
    """The header's scale and device lines, then the setting's paragraph."""
    return "\n".join(
        [
            f"- scale: {settings.scale} (at most {settings.max_rows} training rows per client; "
            f"the paper's MNIST shards: 2,000; {ENCODERS[settings.encoder]}, the paper's: a "
            "small ConvNet)",
            f"- device: {device_facts(settings.device)}",
            "",
            f"N = {settings.clients} clients, T = {settings.rounds} rounds, "
            f"{settings.per_round} clients per round, E = {settings.epochs} local epochs, at "
            f"most {settings.max_rows} training rows per client, seeds {list(settings.seeds)}. "
            "F1: per-client macro-F1 on the client's own test rows, averaged over clients; "
            "mean +- std over seeds. VGM2 predicts with the 'nearest' rule (pi_1-weighted vote "
            "of the 5 nearest training rows); the 'top-pi' column scores the same fitted models "
            "by the mean of each class's 5 largest pi_1 (the rule first tried).",
        ]
    )


COMMUNICATION = "\n".join(
    [
        "## Communication arithmetic",
        "",
        "The paper: per client per round, 2 relations x (K Dirichlet + 4K NIG) = 10K scalars; "
        "at K = 3 that is 30 float32 = **120 bytes** in all (the paper's '~120 bytes per "
        "relation or ~240 bytes total' counts it twice: one relation is 5K = 15 scalars = 60 "
        "bytes). Measured VGM2 uploads add the row count and the loss (2 x 4 bytes): "
        "128 bytes at K = 3, 48 at K = 1.",
    ]
)

#: one experiment per dataset (``--datasets``), each on its own seeded split.
TABLES = PaperTables(
    title="VGM2 Table 1",
    data=None,
    experiments=tuple(
        Experiment(
            name,
            f"VGM2 Table 1 on {name}",
            run_split,
            dataset_table,
            data=partial(seed_split, make),
        )
        for name, make in DATASETS.items()
    ),
)


def kept_cells(settings: Settings) -> list[str]:
    """The report's last section: how many cells this run read back and computed, and the
    commits they were computed at (none without kept cells)."""
    if settings.checkpoints is None or settings.checkpoints.folder is None:
        return []
    return ["## Kept cells\n\n- " + settings.checkpoints.provenance()]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["mnist", "femnist"], choices=DATASETS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--max-rows", type=int, default=None, help="default: the scale's (200 on CPU)"
    )
    parser.add_argument(
        "--encoder",
        choices=list(ENCODERS),
        default="mlp",
        help="VGM2Classifier's encoder for every variant (the paper's: a small ConvNet)",
    )
    add_device(parser)
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="default: benchmarks/results/vgm2 (--paper-scale: vgm2_paper_scale; "
        "--encoder convnet: with _convnet appended)",
    )
    add_checkpoints(
        parser,
        help="keep every finished cell (dataset x variant x seed) in DIR and read it back in "
        "a later run with the same settings; default: <out-dir>/cells",
    )
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 4 clients, 3 rounds, 40 rows, 1 epoch, 1 seed",
    )
    scale.add_argument(
        "--paper-scale",
        action="store_true",
        help="2,000 training rows per client (the paper's shards): for a GPU with --device "
        "cuda, or a CPU over several sessions (finished cells are kept)",
    )
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    args.scale = "quick" if args.quick else "paper" if args.paper_scale else "cpu"
    if args.max_rows is None or args.quick:
        args.max_rows = MAX_ROWS[args.scale]
    if args.quick:
        args.seeds, args.rounds, args.clients, args.epochs = 1, 3, 4, 1
    if args.out_dir is None:
        base = OUT_PAPER_SCALE if args.paper_scale else OUT
        args.out_dir = base.with_name(base.name + "_convnet") if args.encoder == "convnet" else base
    if args.checkpoints is None:
        args.checkpoints = args.out_dir / "cells"
    args.command = command_line("vgm2_table1", argv)
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        clients=args.clients,
        rounds=args.rounds,
        per_round=args.per_round,
        epochs=args.epochs,
        max_rows=args.max_rows,
        device=args.device,
        variants=tuple(args.variants),
        seeds=tuple(range(args.seeds)),
        scale=args.scale,
        out_dir=args.out_dir,
        encoder=args.encoder,
    )
    kept = Checkpoints(args.checkpoints, cell_signature(settings))
    settings = replace(settings, checkpoints=kept)
    return run_paper_tables(
        TABLES,
        settings,
        args.datasets,
        args.command,
        args.quick,
        args.out_dir / "vgm2_table1.md",
        facts=facts(settings),
        after=lambda results: [COMMUNICATION, *kept_cells(settings)],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
