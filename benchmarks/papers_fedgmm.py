"""FedGMM's paper tables at the paper's scale, built from the runs' checkpoints.

:func:`tables` (run by ``python -m benchmarks.paper_results --build``) builds
``benchmarks/results/papers/fedgmm-*.md`` (:mod:`benchmarks.paper_results`) from the seeds and
fits the paper-scale runs have finished so far, kept under
``benchmarks/results/papers/checkpoints/`` by the scripts' ``--checkpoints``:

- Table 2's synthetic row on the reference code's data (``T2_COMMAND``), by client group;

- Table 4 (novel MNIST samples), one file per novelty protocol: the runs
  ``python -m benchmarks.fedgmm_mnist --paper-scale --experiment novelty --protocol P
  --algorithm A --checkpoints CK/fedgmm_t4_P_protocol_A_algorithm`` for A = ``paper`` and
  ``exact`` (the library's default M-step and weights), side by side.

A column whose run has no finished seed yet says so; the facts list the seeds each column
averages. Numbers are AUROC and AP in percent, mean ± sample std over the finished seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.checkpoints import Checkpoints
from benchmarks.common import mean_std
from benchmarks.paper_results import PAPERS, PaperTable

CHECKPOINTS = PAPERS / "checkpoints"
SEEDS = (0, 1, 2)
ALGORITHMS = {
    "paper": 'the paper\'s (`covariance_pooling="paper"`, `global_weights="client_average"`)',
    "exact": "the library's default (exact pooled covariances, pooled weights)",
}
T4_DIFFERS = (
    "the Gaussians model a 24-component federated PCA of the unit-norm pixels and the "
    "learners are linear on the pixels (paper: a pretrained ResNet18's features, PCA to 48); "
    "clients, images, Dirichlet(0.4), 200 rounds and batch 128 as the paper's"
)
#: our rows that are a row of the paper's Table 4 (its method's name there).
T4_PAPER_ROWS = {"FedGMM log p(x)": "FedGMM", "FedEM MSP": "FedEM", "FedAvg MSP": "FedAvg"}
T4_PROTOCOLS = {
    "paper": "App. C.3 protocol: a quarter of the training images transformed, a quarter "
    "relabelled",
    "simple": "unshifted training images (not App. C.3's quarters)",
}


def finished_seeds(folder: Path, experiment: str, seeds=SEEDS) -> dict[int, dict]:
    """The finished seeds' results of ``experiment`` in a run's checkpoint ``folder`` (read
    whatever settings they were computed under: one folder holds one run's settings)."""
    out = {}
    for seed in seeds:
        path = folder / f"{experiment}-seed{seed}.pkl"
        if path.exists():
            record = Checkpoints(folder, "").load_any(f"{experiment}-seed{seed}")
            out[seed] = record
    return out


def t4_run(protocol: str, algorithm: str) -> str:
    """The checkpoint folder's name of one Table 4 run."""
    return f"fedgmm_t4_{protocol}_protocol_{algorithm}_algorithm"


def _metric(records: dict[int, dict], row: str, key: str) -> list[float]:
    return [r["value"]["rows"][row][key] for r in records.values() if row in r["value"]["rows"]]


def t4_table(protocol: str, root: Path = CHECKPOINTS) -> PaperTable | None:
    """Table 4 under ``protocol`` from both algorithms' checkpoints; ``None`` when neither
    has a finished seed."""
    from benchmarks.fedgmm_mnist import CENTRAL, PAPER_TABLE4, ROWS

    runs = {
        algorithm: finished_seeds(
            root / f"fedgmm_t4_{protocol}_protocol_{algorithm}_algorithm", "novelty"
        )
        for algorithm in ALGORITHMS
    }
    if not any(runs.values()):
        return None

    def cell(algorithm: str, row: str) -> str:
        records = runs[algorithm]
        if not records:
            return "not run yet"
        auroc, ap = _metric(records, row, "AUROC"), _metric(records, row, "AP")
        return f"{mean_std(auroc, 2)} / {mean_std(ap, 2)}" if auroc else "-"

    rows = []
    for row, _, _ in (*ROWS, (CENTRAL, "", "")):
        paper = PAPER_TABLE4.get(T4_PAPER_ROWS.get(row, ""))
        shown = f"{paper[0]:.2f} / {paper[1]:.2f}" if paper else "-"
        rows.append([row, shown, *(cell(a, row) for a in ALGORITHMS)])
    seeds = "; ".join(
        f"{a}: {' '.join(map(str, sorted(r))) or 'none yet'}" for a, r in runs.items()
    )
    commits = sorted({r["commit"] for rs in runs.values() for r in rs.values()})
    dates = sorted({r["date"] for rs in runs.values() for r in rs.values()})
    return PaperTable(
        name=f"fedgmm-t4-{protocol}-protocol",
        scale=t4_scale(runs),
        title=f"FedGMM Table 4: novel MNIST samples, {T4_PROTOCOLS[protocol]}",
        paper="FedGMM (000), Table 4 (AUROC / AP, %)",
        command=(
            f"python -m benchmarks.fedgmm_mnist --paper-scale --experiment novelty "
            f"--protocol {protocol} --algorithm paper|exact --checkpoints "
            f"{CHECKPOINTS.relative_to(PAPERS.parents[2])}/fedgmm_t4_{protocol}_protocol_<algorithm>_algorithm"
        ),
        algorithm="; ".join(f"ours, {a}: {text}" for a, text in ALGORITHMS.items()),
        differs=T4_DIFFERS,
        seeds=[seeds],
        device="cpu (2 cores, one torch thread)",
        header=["score", "paper AUROC / AP", "ours, paper algorithm", "ours, default"],
        rows=rows,
        verdict=t4_verdict(runs, protocol),
        date=", ".join(dates),
        commit=", ".join(commits),
    )


def t4_scale(runs: dict[str, dict[int, dict]]) -> str:
    """``"paper"`` when every finished seed ran the paper's size and rounds (read from the
    settings its checkpoint recorded), else ``"reduced (...)"`` naming what differs."""
    from benchmarks.fedgmm_mnist import PAPER_SCALE, PAPER_SIZE

    differs = set()
    for records in runs.values():
        for record in records.values():
            settings = json.loads(record["signature"])
            if settings["size"] != PAPER_SIZE:
                differs.add(f"data {settings['size']}")
            fit = settings["fit"]
            differs |= {f"{k}={fit.get(k)!r}" for k, v in PAPER_SCALE.items() if fit.get(k) != v}
    return "paper" if not differs else f"reduced ({', '.join(sorted(differs))})"


def t4_verdict(runs: dict[str, dict[int, dict]], protocol: str = "paper") -> str:
    """What the finished seeds say of the headline claim (``log p(x)`` at 99.21) per
    algorithm, with the centralized model on the same features as the diagnosis of a gap,
    and the baselines' MSP against the paper's."""
    from benchmarks.fedgmm_mnist import CENTRAL

    done = {a: records for a, records in runs.items() if records}
    parts, gaps = [], []
    for algorithm, records in done.items():
        px = float(np.mean(_metric(records, "FedGMM log p(x)", "AUROC")))
        minutes = np.mean([r["seconds"] for r in records.values()]) / 60
        gap = px - 99.21
        gaps.append(gap)
        word = "reproduced" if gap >= -0.5 else "not reproduced"
        parts.append(
            f"FedGMM log p(x), {algorithm} algorithm: {px:.2f} against the paper's 99.21 "
            f"({gap:+.2f}; {word}, half a point counted as reproduced; {minutes:.0f} min per "
            "seed on a shared core)"
        )
    records = next(iter(done.values()))
    central = float(np.mean(_metric(records, CENTRAL, "AUROC")))
    fedem = float(np.mean(_metric(records, "FedEM MSP", "AUROC")))
    if min(gaps) < -0.5:
        parts.append(
            f"the centralized PCA + GMM on the same features scores {central:.2f}, so the gap "
            "is the density's features (a 24-d PCA of pixels in place of the paper's ResNet18 "
            "features), not federation"
        )
    parts.append(f"FedEM's MSP {fedem:.2f} against the paper's 86.04: {MSP_DIAGNOSIS[protocol]}")
    return "; ".join(parts) + "."


#: why the baselines' maximum softmax probability trails the paper's, per protocol.
MSP_DIAGNOSIS = {
    "paper": "linear learners on pixels whose labels are a quarter permuted and images a "
    "quarter inverted are no confident classifiers, so MSP does not separate novel images",
    "simple": "the learners are linear on raw pixels (the paper's learn on a pretrained "
    "ResNet18's features), a likely cause not measured apart: a weaker classifier's softmax "
    "separates transformed digits less well; FedGMM's log p(x) does not depend on the "
    "learners",
}


T2_RUN = "fedgmm_t2_reference_data"
T2_COMMAND = (
    "python -m benchmarks.fedgmm_pfl --paper-scale --data reference --algorithm both "
    "--experiment pfl --checkpoints benchmarks/results/papers/checkpoints/" + T2_RUN
)


def finished_fits(folder: Path, seeds=SEEDS) -> dict[str, dict[int, dict]]:
    """The finished fits of a ``fedgmm_pfl`` run's checkpoint ``folder``: method -> seed ->
    record (``pfl-seed<s>-<method>.pkl``)."""
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("pfl-seed*-*.pkl")):
        seed, method = path.stem.removeprefix("pfl-seed").split("-", 1)
        if int(seed) in seeds:
            record = Checkpoints(folder, "").load_any(path.stem)
            out.setdefault(method, {})[int(seed)] = record
    return out


def t2_table(root: Path = CHECKPOINTS) -> PaperTable | None:
    """Table 2's synthetic row on the reference code's data, by client group; ``None`` when
    no fit has finished."""
    from benchmarks.fedgmm_pfl import METHODS, PAPER_TABLE2, PAPER_VARIANT

    fits = finished_fits(root / T2_RUN)
    if not fits:
        return None
    settings = json.loads(next(iter(next(iter(fits.values())).values()))["signature"])
    rows, seeds = [], set()
    for method in (*METHODS, PAPER_VARIANT):
        records = fits.get(method, {})
        seeds |= set(records)

        def cell(key: str, records=records) -> str:
            values = [r["value"][key] for r in records.values()]
            return mean_std(values) if values else "not run yet"

        paper = PAPER_TABLE2[method.split("-")[0]]
        rows.append([method, f"{paper:.2f}", cell("accuracy"), cell("gaussian"), cell("beta")])
    scale = "paper"
    if (settings["n_clients"], settings["max_iter"]) != (300, 200):
        scale = f"reduced ({settings['n_clients']} clients, {settings['max_iter']} rounds)"
    minutes = {m: np.mean([r["seconds"] for r in rs.values()]) / 60 for m, rs in fits.items() if rs}
    return PaperTable(
        name="fedgmm-t2-synthetic",
        title="FedGMM Table 2, synthetic row: personalised accuracy on the reference code's data",
        scale=scale,
        paper="FedGMM (000), Table 2, synthetic row (accuracy %)",
        command=T2_COMMAND,
        algorithm=(
            "FedGMM: the library's default M-step and pooled weights; FedGMM-paper: "
            '`covariance_pooling="paper"`, `global_weights="client_average"`; the baselines '
            "are `JointFedGMMDetector.pfl_baseline` configurations (one Gaussian)"
        ),
        differs=(
            "the reference code's generator (its last 10 clients draw raw Beta rows; sizes "
            "100-1,000 rows a client where the text says ~3,000), test rows a quarter of each "
            "client's training rows (reference code: 5,000), the learning rate fixed at 0.5 "
            "(paper: grid-searched); 5 local epochs, batch 32, 3 Gaussians and 3 learners"
        ),
        seeds=sorted(seeds),
        device="cpu (2 cores, one torch thread)",
        header=[
            "method",
            "paper Table 2 %",
            "ours, all clients",
            "Gaussian clients",
            "Beta clients",
        ],
        rows=rows,
        verdict=t2_verdict(fits, settings),
        notes="Minutes per fit: " + ", ".join(f"{m} {v:.0f}" for m, v in minutes.items()) + ".",
        date=", ".join(sorted({r["date"] for rs in fits.values() for r in rs.values()})),
        commit=", ".join(sorted({r["commit"] for rs in fits.values() for r in rs.values()})),
    )


def t2_verdict(fits: dict, settings: dict) -> str:
    """The ordering claim FedGMM > FedEM > FedAvg and the gap to the paper's numbers, over the
    seeds every method has finished, and the Beta clients beside their majority label's share
    (a constant guess's accuracy, recomputed from the seeds' data)."""
    from benchmarks.fedgmm_pfl import PAPER_TABLE2, Settings, beta_clients, make_data

    methods = [m for m in fits if m in PAPER_TABLE2]
    seeds = sorted(set.intersection(*(set(fits[m]) for m in methods))) if methods else []
    if not {"FedGMM", "FedEM", "FedAvg"} <= set(methods) or not seeds:
        return "not every method has finished a fit of one seed yet."

    def mean(method: str, key: str) -> float:
        return float(np.mean([fits[method][s]["value"][key] for s in seeds]))

    acc = {m: mean(m, "accuracy") for m in methods}
    shift = [acc[m] - PAPER_TABLE2[m] for m in methods]
    order = acc["FedGMM"] > acc["FedEM"] > acc["FedAvg"]
    text = (
        f"Over seeds {' '.join(map(str, seeds))}: FedGMM > FedEM > FedAvg "
        f"{'holds' if order else 'does not hold'} ({acc['FedGMM']:.1f} / {acc['FedEM']:.1f} / "
        f"{acc['FedAvg']:.1f} against the paper's 72.02 / 65.61 / 53.21; FedGMM - FedEM "
        f"{acc['FedGMM'] - acc['FedEM']:+.1f} against +6.4). Every method of Table 2 scores "
        f"{min(shift):+.1f} to {max(shift):+.1f} points from the paper's number: the paper's "
        "clients hold ~3,000 rows in its text, ours 100-1,000 by its code's size rule, and its "
        "learning rate was grid-searched, ours fixed at 0.5"
    )
    run = Settings(settings["n_clients"], settings["max_iter"], tuple(seeds), data="reference")
    shares = []
    for seed in seeds:
        data = make_data(run, seed)
        beta = np.isin(data.groups_test, beta_clients(run))
        if beta.any():
            positive = data.y_test[beta].mean()
            shares.append(100 * max(positive, 1 - positive))
    if shares and {"Local"} <= set(methods):
        text += (
            f". The 10 Beta clients: FedGMM {mean('FedGMM', 'beta'):.1f}, FedEM "
            f"{mean('FedEM', 'beta'):.1f}, FedAvg {mean('FedAvg', 'beta'):.1f}, Local (each "
            f"client's own learner) {mean('Local', 'beta'):.1f}, against {np.mean(shares):.1f} "
            "for always guessing their majority label; the Gaussian clients: FedGMM "
            f"{mean('FedGMM', 'gaussian'):.1f}, FedEM {mean('FedEM', 'gaussian'):.1f}"
        )
    return text + "."


def tables(root: Path = CHECKPOINTS) -> list[PaperTable]:
    """Every FedGMM table some run has a finished seed or fit of."""
    found = [t2_table(root), *(t4_table(protocol, root) for protocol in T4_PROTOCOLS)]
    return [table for table in found if table is not None]
