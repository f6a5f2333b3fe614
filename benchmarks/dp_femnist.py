"""FEMNIST writers under differential privacy, on a public projection of the images.

The FEMNIST task's features (``make_task("femnist:<ood>", ...)``, the default ``"polar"``
map) are each image's direction on 24 *federated* principal axes plus the log of its L2 norm;
federated PCA has no private form, so a private fit needs a projection chosen without any
writer's rows. Here it is a **public projection**:

- ``mnist-pca``: the 24 principal axes (and the mean) of the directions ``x / ||x||`` of
  MNIST's 60,000 training digits (pixels / 255; a public dataset, not the writers), then the
  task's polar map: ``[(x / ||x|| - mean) @ axes.T, log ||x||]``, 25 features. Each writer
  applies this fixed map to its own rows (post-processing of nothing private).
- ``random``: 24 orthonormal Gaussian directions (seeded, data-independent), no centring,
  the same log norm.

The public box ``Privacy.bounds`` is each feature's range over MNIST's training digits under the
same projection (public). ``"auto"`` clipping is the detectors' default; the ``public
clip`` settings set ``Privacy.clip`` to the largest norm of the MNIST rows in the box's units
(``[-1, 1]`` per feature), also public, and fit in the box's units
(``Prior(standardize=False)``).
The closed-form box of the projection (pixels in [0, 1] bound every feature: direction
coordinates within ``[-||a^-|| - a.mean, ||a^+|| - a.mean]``, log norm within
``[log(1/255), log 28]``) is printed for comparison and not used: its log-norm range is 5.6
times MNIST's.

Writers, split and novel images are the task's: ``make_task("femnist:<ood>", n_clients=N,
alpha=None, seed=s)`` (clients = the first N writers of a seeded choice, 60 % of each
writer's images for training, its test images halved into inliers and novel images), and
the raw pixels of the same rows from ``make_femnist_federated`` with the task's seed (checked
against the task's log-norm feature). Detectors (K = 10; under DP ``delta = 1e-5``):

- ``FedGMM``: ``FedGMMDetector`` (federated EM, personal weights: under central DP every
  writer scores with the global weights), 3 Lloyd + 40 EM rounds under DP (44 releases with
  the moments round), the defaults (up to 100 rounds) without.
- ``FedVB``: ``FedVBDetector`` (at most 10 components), 3 Lloyd + 20 VB rounds under DP.
- ``FedGenGMM``: ``FedGenGMMDetector`` (one-shot; each writer fits locally, K by BIC without
  DP; under DP K fixed at 10 with 20 DP-EM iterations, or K = 1 with 1 iteration in the
  ``client K=1`` setting).
- ``FedGMM K=1``: one Gaussian (1 Lloyd + 1 EM round + moments: 3 releases).

``inf`` fits the same setting without DP; ``fed. PCA`` fits it without DP on the task's own
features (federated PCA, min-max scaled by the writers' ranges), the reference.
AUROC and AUC-PR (``aupr_out``: novel rows the positive class), mean and spread over seeds.
Novel sets: ``transforms`` (scale 0.5, rotation, flip: every setting) and ``inv-flip-rot``
(invert, flip, rotate: the three detectors with their defaults).

Run: ``.venv/bin/python -m benchmarks.dp_femnist`` (100 writers, seeds 0 1 2, 252 results;
19 minutes on 2 cores, 47 with other jobs beside it; writes ``benchmarks/dp_femnist.txt``) or
``--quick`` (8 writers, one seed, epsilon 1 and inf, three settings, 10,000 MNIST digits;
writes only with ``--out``). ``--writers``, ``--seeds``, ``--epsilons``, ``--ood``,
``--out``, ``--rows FILE`` (every fit as CSV).
"""

from __future__ import annotations

import argparse
import csv
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    add_out,
    add_quick,
    add_seeds,
    command_line,
    emit_report,
    markdown_table,
    mean_std,
    report_header,
)
from fednovelty.datasets import load_mnist, make_femnist_federated
from fednovelty.datasets.protocols import MNIST_PCA_COMPONENTS, _novel_images, make_task, polar_rows
from fednovelty.detectors import (
    FedGenGMMDetector,
    FedGMMDetector,
    FedVBDetector,
    Initialisation,
    Prior,
    Privacy,
)
from fednovelty.evaluation import aupr_out, auroc
from fednovelty.federated.trust.dp_split import BLOCK_SPLIT

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
DELTA = 1e-5
N_COMPONENTS = 10
OOD_SETS = ("transforms", "inv-flip-rot")
DETECTORS = {"FedGMM": FedGMMDetector, "FedVB": FedVBDetector, "FedGenGMM": FedGenGMMDetector}
DEFAULT_OUT = Path(__file__).resolve().parent / "dp_femnist.txt"


# ----------------------------------------------------------------------------- projections
@dataclass(frozen=True)
class Projection:
    """A fixed map of images to the task's polar features, chosen without any writer's rows.

    Attributes:
        name: ``"mnist-pca"`` or ``"random"``.
        centre: (n_pixels,) subtracted from each direction before projecting.
        axes: (n_axes, n_pixels), orthonormal rows.
    """

    name: str
    centre: np.ndarray
    axes: np.ndarray

    def features(self, pixels: np.ndarray) -> np.ndarray:
        """Pixels in [0, 1] (n, n_pixels) -> (n, n_axes + 1): the direction's coordinates on
        the axes and the log of the row's L2 norm (``polar_rows``, the task's map)."""
        unit, log_norm = polar_rows(pixels)
        return np.c_[(unit - self.centre) @ self.axes.T, log_norm]


def mnist_pca(pixels: np.ndarray, n_axes: int = MNIST_PCA_COMPONENTS) -> Projection:
    """The top ``n_axes`` principal axes of the directions of public images (n, n_pixels),
    each axis signed so that its largest entry is positive (as the task's federated PCA)."""
    unit, _ = polar_rows(pixels)
    centre = unit.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(unit - centre, rowvar=False))
    axes = vectors[:, np.argsort(values)[::-1][:n_axes]].T
    signs = np.sign(axes[np.arange(n_axes), np.abs(axes).argmax(axis=1)])
    return Projection("mnist-pca", centre, axes * signs[:, None])


def random_projection(n_pixels: int, n_axes: int, seed: int) -> Projection:
    """``n_axes`` orthonormal directions drawn from a seeded Gaussian (no data), no centre."""
    gaussian = np.random.default_rng(seed).standard_normal((n_pixels, n_axes))
    q, _ = np.linalg.qr(gaussian)
    return Projection("random", np.zeros(n_pixels), q.T)


def public_box(public_features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Privacy.bounds``: each feature's (low, high) over the public rows (n, d)."""
    return public_features.min(axis=0), public_features.max(axis=0)


def box_units(X: np.ndarray, box: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Rows (n, d) in the box's units, ``[-1, 1]`` per feature inside the box (as the
    detectors map them)."""
    low, high = box
    return (X - (low + high) / 2) / ((high - low) / 2)


def public_clip(public_features: np.ndarray, box: tuple[np.ndarray, np.ndarray]) -> float:
    """The largest L2 norm of the public rows in the box's units: a clip radius for the fits
    in box units that no public row exceeds."""
    return float(np.linalg.norm(box_units(public_features, box), axis=1).max())


def algebraic_box(projection: Projection, n_pixels: int) -> tuple[np.ndarray, np.ndarray]:
    """The range every image with pixels in [0, 1] has under ``projection`` (closed form).

    A direction ``u`` has ``u >= 0`` and ``||u|| = 1``, so ``a . u`` lies in
    ``[-||a^-||, ||a^+||]`` (``a^+``, ``a^-`` the positive and negative parts of an axis);
    the norm lies in ``[1/255, sqrt(n_pixels)]`` (``polar_rows``' floor, all pixels at 1).
    Returns (low, high), each (n_axes + 1,)."""
    axes, shift = projection.axes, projection.axes @ projection.centre
    low = -np.linalg.norm(np.clip(-axes, 0, None), axis=1) - shift
    high = np.linalg.norm(np.clip(axes, 0, None), axis=1) - shift
    return np.r_[low, np.log(1 / 255)], np.r_[high, 0.5 * np.log(n_pixels)]


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class WriterRows:
    """One seed's FEMNIST task and the raw pixels of its rows.

    Attributes:
        task: the ``make_task`` result (its ``X_train`` / ``X_test`` are the federated-PCA
            reference features).
        pixels_train: (n_train, 784) in [0, 1], the task's training rows.
        pixels_test: (n_test, 784) in [0, 1], the task's test rows (novel ones transformed).
    """

    task: object
    pixels_train: np.ndarray
    pixels_test: np.ndarray


def writer_rows(ood: str, n_writers: int, seed: int) -> WriterRows:
    """The FEMNIST task's rows as pixels: ``make_task`` draws the writers first from
    ``default_rng(seed)``, so ``make_femnist_federated`` with a fresh generator of that seed
    gives the same writers; the novel test images are made by the task's own transform.

    Raises:
        RuntimeError: the pixels do not give the task's log-norm feature (the task's
            preparation changed).
    """
    task = make_task(f"femnist:{ood}", n_clients=n_writers, alpha=None, seed=seed)
    writers = make_femnist_federated(n_writers, random_state=np.random.default_rng(seed))
    pixels_train = writers.X_train[task.train_index]
    pixels_test = _novel_images(writers.images_test[task.test_index], task.y_test, ood)
    low, high = task.scaling.data_min[-1], task.scaling.data_max[-1]
    for pixels, X in ((pixels_train, task.X_train), (pixels_test, task.X_test)):
        log_norm = (polar_rows(pixels)[1] - low) / (high - low)
        if not np.allclose(log_norm, X[:, -1], rtol=0, atol=1e-9):
            raise RuntimeError("the pixels do not reproduce the task's log-norm feature.")
    if not np.array_equal(writers.groups_train[task.train_index], task.groups_train):
        raise RuntimeError("the pixels' writers are not the task's.")
    return WriterRows(task, pixels_train, pixels_test)


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """One row of the tables: a detector, its parameters and what DP adds to them.

    Attributes:
        label: the row's name.
        detector: a key of ``DETECTORS``.
        projection: ``"mnist-pca"`` or ``"random"``.
        params: constructor parameters with and without DP.
        private: parameters added under DP (rounds).
        clip: ``"auto"`` (the detector's default) or ``"public"`` (:func:`public_clip`).
        every_ood: run on every novel set (else ``transforms`` only).
    """

    label: str
    detector: str
    projection: str = "mnist-pca"
    params: dict = field(default_factory=dict)
    private: dict = field(default_factory=dict)
    clip: str = "auto"
    every_ood: bool = False


FEDGMM_ROUNDS = {"max_iter": 40, "initialisation": Initialisation(kmeans_rounds=3)}
VB_ROUNDS = {"max_iter": 20, "initialisation": Initialisation(kmeans_rounds=3)}
ONE_ROUND = {"max_iter": 1, "initialisation": Initialisation(kmeans_rounds=1)}
BOX = {"prior": Prior(standardize=False)}
SETTINGS = (
    Setting("FedGMM", "FedGMM", private=FEDGMM_ROUNDS, every_ood=True),
    Setting("FedVB", "FedVB", private=VB_ROUNDS, every_ood=True),
    Setting("FedGenGMM", "FedGenGMM", private={"local_iterations": 20}, every_ood=True),
    Setting("FedGMM, box units, public clip", "FedGMM", params=BOX, private=FEDGMM_ROUNDS,
            clip="public"),
    Setting("FedVB, public clip", "FedVB", private=VB_ROUNDS, clip="public"),
    Setting("FedGenGMM, client K=1, public clip", "FedGenGMM",
            params={"client_components": 1}, private={"local_iterations": 1}, clip="public"),
    Setting("FedGMM K=1, box units, public clip", "FedGMM",
            params={"n_components": 1, **BOX}, private=ONE_ROUND, clip="public"),
    Setting("FedGMM (random projection)", "FedGMM", "random", private=FEDGMM_ROUNDS),
    Setting("FedGMM K=1, box units, public clip (random projection)", "FedGMM", "random",
            params={"n_components": 1, **BOX}, private=ONE_ROUND, clip="public"),
)  # fmt: skip
QUICK_SETTINGS = ("FedGMM", "FedGenGMM, client K=1, public clip", "FedGMM (random projection)")


def build(setting: Setting, epsilon: float, box, clip: float, seed: int):
    """The detector of ``setting`` (``epsilon`` inf: without DP), K = 10 unless set."""
    params = {"n_components": N_COMPONENTS, "random_state": seed, **setting.params}
    if math.isfinite(epsilon):
        private = dict(setting.private)
        fields = {k: private.pop(k) for k in ("local_iterations",) if k in private}
        if setting.clip == "public":
            fields["clip"] = clip
        params.update(private, privacy=Privacy(epsilon=epsilon, delta=DELTA, bounds=box, **fields))
    return DETECTORS[setting.detector](**params)


def fit_score(detector, X, groups, X_test, y_test) -> dict:
    """Fit on the writers' rows, score the test rows: metrics, noise and the model's shape.

    ``width``: the components' weighted mean covariance trace over the training rows'
    covariance trace (1: as wide as the data; far above 1: the noise floor sets it);
    ``kept``: components of weight above 1 %."""
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector.fit(X, groups=groups)
    seconds = time.perf_counter() - started
    scores = np.asarray(detector.decision_function(X_test), dtype=np.float64)
    spent = getattr(detector, "privacy_spent_", None) or {}
    weights, covariances = detector.weights_, detector.covariances_
    traces = [np.trace(c) if c.ndim == 2 else float(np.sum(c)) for c in covariances]
    return {
        "auroc": auroc(y_test, scores),
        "aupr": aupr_out(y_test, scores),
        "seconds": seconds,
        "z": spent.get("noise_multiplier", 0.0),
        "releases": spent.get("releases", 0),
        "spent": spent.get("epsilon", math.inf),
        "clip": spent.get("clip", math.nan),
        "kept": int((weights > 0.01).sum()),
        "width": float(np.dot(weights, traces) / np.trace(np.cov(X, rowvar=False))),
    }


# ----------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Public:
    """A projection with its public box and clip (from MNIST's training digits)."""

    projection: Projection
    box: tuple[np.ndarray, np.ndarray]
    clip: float


def public_maps(mnist_pixels: np.ndarray, seed: int) -> dict[str, Public]:
    """The two projections, each with its box and clip from the MNIST rows."""
    out = {}
    n_pixels = mnist_pixels.shape[1]
    for projection in (
        mnist_pca(mnist_pixels),
        random_projection(n_pixels, MNIST_PCA_COMPONENTS, seed),
    ):
        features = projection.features(mnist_pixels)
        box = public_box(features)
        out[projection.name] = Public(projection, box, public_clip(features, box))
    return out


def run_seed(args, settings, mnist_pixels, seed: int) -> tuple[list[dict], list[dict]]:
    """Every setting, epsilon and novel set for one seed: result rows, and data facts."""
    maps = public_maps(mnist_pixels, seed)
    rows, facts = [], []
    for ood in args.ood:
        data = writer_rows(ood, args.writers, seed)
        task = data.task
        features = {
            name: tuple(p.projection.features(x) for x in (data.pixels_train, data.pixels_test))
            for name, p in maps.items()
        }
        facts.append(data_facts(ood, seed, task, features, maps))
        cache: dict = {}
        for setting in settings:
            if ood != OOD_SETS[0] and not setting.every_ood:
                continue
            public = maps[setting.projection]
            X, X_test = features[setting.projection]
            runs = [(eps, X, X_test) for eps in args.epsilons]
            runs.append(("fed. PCA", task.X_train, task.X_test))
            for eps, X_fit, X_score in runs:
                epsilon = math.inf if eps == "fed. PCA" else eps
                det = build(setting, epsilon, public.box, public.clip, seed)
                reference = eps == "fed. PCA"
                key = (reference, None if reference else setting.projection, repr(det.get_params()))
                if key not in cache:
                    cache[key] = fit_score(det, X_fit, task.groups_train, X_score, task.y_test)
                result = {"ood": ood, "seed": seed, "setting": setting.label, "eps": eps}
                rows.append({**result, **cache[key]})
                r = rows[-1]
                print(
                    f"  {ood:12s} seed {seed} {setting.label:40.40s} eps {eps!s:8s} "
                    f"AUROC {r['auroc']:.4f} AUC-PR {r['aupr']:.4f} z {r['z']:.1f} "
                    f"width {r['width']:.2f} kept {r['kept']} {r['seconds']:.1f}s",
                    flush=True,
                )
    return rows, facts


def data_facts(ood, seed, task, features, maps) -> dict:
    """Rows per writer, and where the writers' rows fall against the public box and clip
    (a diagnostic: nothing here informs a fit)."""
    sizes = np.bincount(task.groups_train)
    X = features["mnist-pca"][0]
    public = maps["mnist-pca"]
    low, high = public.box
    norms = np.linalg.norm(box_units(X, public.box), axis=1)
    algebra_low, algebra_high = algebraic_box(public.projection, 784)
    return {
        "ood": ood,
        "seed": seed,
        "writers": sizes.size,
        "n_train": int(sizes.sum()),
        "n_test": int(task.y_test.size),
        "novel": int(task.y_test.sum()),
        "sizes": sizes,
        "outside_box": float(((X < low) | (X > high)).any(axis=1).mean()),
        "clip": public.clip,
        "clipped": float((norms > public.clip).mean()),
        "norm_quartiles": np.percentile(norms, [25, 50, 75]),
        "box_variance": {
            name: float(box_units(features[name][0], maps[name].box).var(axis=0).mean())
            for name in maps
        },
        "log_norm_box": (low[-1], high[-1]),
        "log_norm_writers": (X[:, -1].min(), X[:, -1].max()),
        "log_norm_algebra": (algebra_low[-1], algebra_high[-1]),
        "direction_algebra": (algebra_low[:-1].min(), algebra_high[:-1].max()),
        "direction_box": (low[:-1].min(), high[:-1].max()),
    }


# ----------------------------------------------------------------------------- report
def eps_label(eps) -> str:
    if isinstance(eps, str):
        return eps
    return "inf" if math.isinf(eps) else f"{eps:g}"


def metric_table(rows: list[dict], ood: str, metric: str, settings, epsilons) -> str:
    columns = [*epsilons, "fed. PCA"]
    header = ["setting", *[f"eps {eps_label(e)}" for e in columns]]
    body = []
    for setting in settings:
        cells = []
        for eps in columns:
            vals = [
                r[metric]
                for r in rows
                if r["ood"] == ood and r["setting"] == setting.label and r["eps"] == eps
            ]
            cells.append(mean_std(vals, 3) if vals else "")
        if any(cells):
            body.append([setting.label, *cells])
    return markdown_table(header, body)


def noise_floor(z: float, clip: float, d: int, n_k: float) -> float:
    """The covariance eigenvalue floor the server keeps on a component of ``n_k`` rows:
    the noise's spectral norm ``2 * s_second * z * B**2 * sqrt(d) / n_k``."""
    return 2 * BLOCK_SPLIT["second"] * z * clip**2 * math.sqrt(d) / n_k


def diagnosis_table(rows, facts, settings, epsilons, d: int) -> str:
    """Per setting at the listed epsilons (transforms, seeds pooled): the noise, the rows
    behind a component, the floor against the rows' variance and the fitted model's shape."""
    fact = [f for f in facts if f["ood"] == OOD_SETS[0]]
    n_train = float(np.mean([f["n_train"] for f in fact]))
    median_writer = float(np.mean([np.median(f["sizes"]) for f in fact]))
    body = []
    for setting in settings:
        variance = float(np.mean([f["box_variance"][setting.projection] for f in fact]))
        for eps in epsilons:
            got = [
                r
                for r in rows
                if r["ood"] == OOD_SETS[0] and r["setting"] == setting.label and r["eps"] == eps
            ]
            if not got:
                continue
            z = float(np.mean([r["z"] for r in got]))
            clip = float(np.mean([r["clip"] for r in got]))
            k = setting.params.get("n_components", N_COMPONENTS)
            if setting.detector == "FedGenGMM":
                k = setting.params.get("client_components") or 10
                n_k = median_writer / k
            else:
                n_k = n_train / k
            floor = noise_floor(z, clip, d, n_k) if z else 0.0
            standardized = setting.params.get("prior", Prior()).standardize
            if standardized and setting.detector == "FedGMM":
                # the private standardisation is one diag "component" of every row in box
                # units: its variances are at least its floor, so the "z-scores" divide by
                # sqrt(max(variance, floor)) and the components' floor (in those units) is
                # that many times the rows' variance there
                moments = noise_floor(z, clip, d, n_train) if z else 0.0
                ratio = floor * max(variance, moments) / variance
                floor_note = f"{ratio:.1f} (standardisation {moments / variance:.1f})"
            else:
                floor_note = f"{floor / variance:.1f}"
            body.append(
                [
                    setting.label,
                    eps_label(eps),
                    f"{z:.1f}",
                    str(int(np.mean([r["releases"] for r in got]))),
                    f"{clip:.2f}",
                    f"{n_k:.0f}",
                    f"{8 * z:.0f}",
                    floor_note,
                    mean_std([r["width"] for r in got], 2),
                    f"{np.mean([r['kept'] for r in got]):.1f}",
                ]
            )
    return markdown_table(
        [
            "setting",
            "eps",
            "z",
            "releases",
            "clip B",
            "rows per component",
            "count noise sd (8z)",
            "cov. floor / feature variance",
            "fitted width",
            "components > 1 %",
        ],
        body,
    )


def facts_lines(facts: list[dict]) -> list[str]:
    lines = []
    for f in facts:
        if f["ood"] != OOD_SETS[0]:
            continue
        q1, med, q3 = np.percentile(f["sizes"], [25, 50, 75])
        lines.append(
            f"- seed {f['seed']}: {f['writers']} writers, {f['n_train']} training rows "
            f"(per writer min {f['sizes'].min()}, quartiles {q1:.0f} / {med:.0f} / {q3:.0f}, "
            f"max {f['sizes'].max()}), {f['n_test']} test rows ({f['novel']} novel); "
            f"writers' training rows outside the MNIST box: {100 * f['outside_box']:.1f} %; "
            f"clipped by the public clip {f['clip']:.2f}: {100 * f['clipped']:.1f} % (their "
            f"norms in box units, quartiles "
            + " / ".join(f"{v:.2f}" for v in f["norm_quartiles"])
            + "); mean per-feature variance in box units "
            + ", ".join(f"{v:.3f} ({k})" for k, v in f["box_variance"].items())
        )
    f = facts[0]
    lines.append(
        "- box (seed {s}, mnist-pca): log norm [{a:.2f}, {b:.2f}] from MNIST, the writers' "
        "[{c:.2f}, {e:.2f}], the closed form [{g:.2f}, {h:.2f}]; direction coordinates within "
        "[{i:.2f}, {j:.2f}] from MNIST, [{k:.2f}, {m:.2f}] in closed form".format(
            s=f["seed"],
            a=f["log_norm_box"][0],
            b=f["log_norm_box"][1],
            c=f["log_norm_writers"][0],
            e=f["log_norm_writers"][1],
            g=f["log_norm_algebra"][0],
            h=f["log_norm_algebra"][1],
            i=f["direction_box"][0],
            j=f["direction_box"][1],
            k=f["direction_algebra"][0],
            m=f["direction_algebra"][1],
        )
    )
    return lines


def timing_table(rows, settings) -> str:
    body = []
    for setting in settings:
        private = [r["seconds"] for r in rows if r["setting"] == setting.label and r["z"] > 0]
        plain = [
            r["seconds"]
            for r in rows
            if r["setting"] == setting.label and r["z"] == 0 and r["eps"] != "fed. PCA"
        ]
        if private or plain:
            body.append(
                [
                    setting.label,
                    mean_std(private, 1) if private else "",
                    mean_std(plain, 1) if plain else "",
                ]
            )
    return markdown_table(["setting", "DP fit s", "non-private fit s"], body)


def report(args, settings, rows, facts, seconds: float, command: str) -> str:
    header = report_header(
        "FEMNIST writers under differential privacy (public projection)",
        command,
        args.quick,
        seconds,
    )
    d = MNIST_PCA_COMPONENTS + 1
    sections = [
        header,
        f"- {args.writers} writers, seeds {list(args.seeds)}, K = {N_COMPONENTS}, delta "
        f"{DELTA:g}, central noise; public projection: MNIST's {MNIST_PCA_COMPONENTS} principal "
        f"axes of the digits' directions + log norm ({d} features), box and clip from MNIST",
        "\n".join(["## Data", "", *facts_lines(facts)]),
    ]
    for ood in args.ood:
        for metric, name in (("auroc", "AUROC"), ("aupr", "AUC-PR (novel = positive)")):
            sections.append(
                f"## {ood}: {name}, mean ± sd over seeds\n\n"
                + metric_table(rows, ood, metric, settings, args.epsilons)
            )
    diag_eps = [e for e in args.epsilons if e in (1.0, 8.0)] or list(args.epsilons[:1])
    sections.append(
        "## Diagnosis (transforms, seeds pooled)\n\n"
        "rows per component: training rows / K (FedGenGMM: the median writer's rows / its K); "
        "cov. floor: the server's floor on a component's covariance eigenvalues, "
        "2 * 0.595 * z * B^2 * sqrt(d) / rows, over the writers' mean per-feature variance "
        "in box units (FedGMM with standardize: in its private z-scores, whose variances are "
        "floored at the same formula with all training rows, shown in brackets over the "
        "variance in box units); fitted width: weighted mean covariance trace / the rows' "
        "covariance trace.\n\n" + diagnosis_table(rows, facts, settings, diag_eps, d)
    )
    sections.append("## Fit time (seconds, mean ± sd)\n\n" + timing_table(rows, settings))
    return "\n\n".join(sections) + "\n"


def write_rows(rows: list[dict], path: Path) -> None:
    """Every fit's result as one CSV line (the columns of ``fit_score`` and its keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    parser.add_argument("--writers", type=int, default=100)
    add_seeds(parser)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--ood", nargs="+", default=list(OOD_SETS), choices=OOD_SETS)
    add_out(parser)
    parser.add_argument("--rows", type=Path, default=None, help="also write every fit as CSV")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(1)
    settings = SETTINGS
    mnist = load_mnist()["x_train"]
    if args.quick:
        args.writers, args.seeds, args.epsilons = 8, args.seeds[:1], [1.0, math.inf]
        args.ood = [OOD_SETS[0]]
        settings = tuple(s for s in SETTINGS if s.label in QUICK_SETTINGS)
        mnist = mnist[:10_000]
    elif args.out is None:
        args.out = DEFAULT_OUT
    mnist_pixels = mnist.reshape(mnist.shape[0], -1).astype(np.float64) / 255.0
    command = command_line("dp_femnist", argv)
    started = time.perf_counter()
    rows, facts = [], []
    for seed in args.seeds:
        seed_rows, seed_facts = run_seed(args, settings, mnist_pixels, seed)
        rows += seed_rows
        facts += seed_facts
    if args.rows is not None:
        write_rows(rows, args.rows)
    text = report(args, settings, rows, facts, time.perf_counter() - started, command)
    return emit_report(text, args.out)


if __name__ == "__main__":
    main()
