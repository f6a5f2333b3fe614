"""Poisoning benchmark: one or two malicious clients among ten, defences off and on.

Every task is the novelty protocol of an ADBench set (:func:`make_task`, 10 clients,
Dirichlet(``ALPHA``) over k-means groups). The malicious clients replace clients 9 (and 8):
their real rows are not used. Each holds made-up rows around a point far from the training
data, ``FAR`` training ranges beyond the training maximum in every feature, with a spread
of ``SPREAD`` ranges (:func:`far_rows`), and forges its replies in the client step; the
honest algorithm code runs unchanged on every other client and on the server
(:class:`WithAttackers`).

Attacks (:data:`ATTACKS`):

``claim-rows``
    A consistent liar: ``CLAIMED_ROWS`` (10,000) made-up rows, answered about honestly from
    its first reply on.
``claim-1e12``
    Real-looking far rows (as many as the median honest client), every sum over rows it
    sends scaled so that it claims 1e12 rows, consistently from its first reply on
    (``moments``' ``n_samples`` and ``m2``; ``counts``, ``sums``, ``second``,
    ``log_likelihood``, ``n_samples``; FedGenGMM's ``n_samples``).
``inconsistent-count`` (federated EM)
    Declares its true row count in its first reply, then every sum x ``INCONSISTENT_FACTOR``.
``non-psd`` (federated EM)
    Honest but for the EM rounds' second moment of its fullest component, negated: no
    rows have such statistics. Without validation the M-step raises and the fit stops.
``tiny-precision`` (FedGenGMM)
    A local mixture with ``n_samples=10`` and precision factors x 1e-75 (covariances about
    1e150).
``many-components`` (FedGenGMM)
    A local mixture of ``MANY_COMPONENTS`` (200,000) components although the broadcast
    allows at most ``max(k_range)``. Not run with validation off: the server would draw
    ``H * 200,000`` (2e7) synthetic rows.

The planted anomalies: ``N_PLANTED`` rows drawn like the attackers' rows (a fresh draw,
never seen in training). Two AUROCs per fit (``-log p(x)`` ranks the rows; novel is
positive): ``auroc`` on the dataset's own test set (its anomalies against the held-out
inliers) and ``planted_auroc``, the planted rows against the same held-out inliers. A
successful ``claim-rows`` or ``claim-1e12`` attack shows in ``planted_auroc`` (the planted
rows score as normal: AUROC near 0); one that wrecks the model shows in ``auroc``.

Defences (:func:`defences`): ``off`` (no reply validation, ``aggregation="sum"``, no cap: a
server that trusts every reply; validation is always on in the library and is switched off
here by replacing the engine's ``ReplyValidator`` with one that accepts everything),
``validation`` (the library's default), ``cap`` (``client_weight_cap=CAP``), ``trimmed T``
(``aggregation="trimmed"``, ``trim=T``: 0.1 against one attacker; 0.2, and 0.1 which is too
little, against two), ``both T`` (``trimmed T`` and the cap, at 0.1 per attacker) and, for
FedGenGMM, ``median`` and ``median+cap``. The no-attack rows (``attack="none"``: the ten
honest clients) run every defence too: their cost on honest federations. ``attack="absent"``
(defences off) is the federation without the attackers' clients, the honest 8 or 9 alone:
what the attacked federation could reach at best.

Algorithms, with the detectors' defaults: ``FederatedEM`` as ``FedGMMDetector`` builds it
(``n_components=8``, personal mixture weights, k-means initialisation, ``standardize``,
``prior_strength = d + 2``, ``prior_scale = 4``) and ``FedGenGMM`` as ``FedGenGMMDetector``
does (K by BIC in 1..10 on clients and server, ``H = 100``, same remedies). Both run on the
in-process engine with its default privacy policy; the score is
``fednovelty.mixture.score_samples(params, X)``.

**The other families** (``--families``): FedVB, one-shot VB (``FederatedVBOneShot``), the
kNN markers (``FederatedKNNMarkers``), the clustered mixture (``ClusteredEM``), the local
baseline ``LocalGMMs``, StreamingEM, JointFedGMM, pFedEM, VGM2's FedAvg baseline and
ClusteredFL (FedAvg+) on a synthetic task (:func:`family_task`: three Gaussian classes in
``FAMILY_D`` features, ten clients of ``FAMILY_ROWS`` rows; the liar, client 9, holds rows
``FAMILY_FAR`` away for the mixtures (for the kNN markers, whose feature is a row's
distance to its client's neighbours, also ``FAMILY_WIDE`` times as spread), and rows of the
classes with labels shifted by one class for the classifiers). Attacks: ``scale-1e10``
(every sum over rows of every reply x 1e10, from the first reply on; the ``EXTENSIVE``
tensors) and ``far-centroid`` (honest, but its first k-means centroid at 1e133; the
families that start with federated k-means: FedVB, the kNN markers, the clustered mixture,
joint, pFedEM). Options (the ``aggregation`` column): ``sum`` (the default), each robust
``aggregation`` the family has (``trimmed`` at 0.1 and, for the model-update families,
``median``) and ``cap`` (the sum with ``client_weight_cap=CAP``). One-shot VB runs
``trimmed`` (outlying client posteriors left out, every client counted as the typical
client's rows); the kNN markers are
federated VB on a one-column feature and have FedVB's options; ``LocalGMMs`` aggregates
nothing (every client keeps its own model), so it has none and the liar can only spoil its
own model. Reference: the nine honest clients alone (``absent``); cost: the ten clients
with the liar honest (``none``). The score is the AUROC of ``-log p(x)`` (inliers against
anomalies where the liar's rows lie and in a wide box) for the mixtures (``LocalGMMs``:
the mean over the honest clients' own models; ``liar_score``: the liar's), the accuracy on
held-out rows for the classifiers, and for the kNN markers the balanced accuracy of
flagging a tail probability below ``KNN_LEVEL`` (a row's feature: its distance to the
``n_neighbors``-th nearest training row of client ``KNN_REFERENCE_CLIENT``; one
posterior's tail probability is monotone in that distance, so an AUROC would be the same
for any posterior). Written to ``<out>/poisoning_families.csv`` and
``poisoning_families.md``.

Run (about 17 minutes on 2 shared cores)::

    .venv/bin/python -m benchmarks.poisoning               # 4 datasets x 3 seeds
    .venv/bin/python -m benchmarks.poisoning --quick       # smoke run: 4_breastw, seed 0
    .venv/bin/python -m benchmarks.poisoning --families    # the other families, 3 seeds (~1.5 min)

It prints one line per (dataset, algorithm, attack, attackers, defence) with mean +- std
over seeds of both AUROCs, the replies the validation dropped per fit and the seconds per
fit, writes every fit to ``<out>/poisoning.csv`` (``error``: why a fit stopped or was not
run; ``left_out``: FedGenGMM client models a robust aggregation left out) and the means
over datasets to ``<out>/poisoning.md`` (``--out``, default ``benchmarks/results``).
FedGenGMM's client fits do not depend on the server's configuration, so each client's
reply is computed once per task and reused (:class:`WithAttackers`): its ``seconds`` are
the server's time, plus the client fits in the first run that needs them.
"""

from __future__ import annotations

import argparse
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np
import pandas as pd
import torch

from benchmarks.common import add_out, markdown_table, mean_std
from fednovelty.datasets.protocols import Task, make_task
from fednovelty.detectors._params import PRIOR_SCALE
from fednovelty.evaluation.metrics import auroc
from fednovelty.federated import FederatedAlgorithm, FederatedEM, FedGenGMM, Message
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers, predictive_log_tail
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.bayesian.vgm2_networks import embed, encoder_template, head_template
from fednovelty.federated.clustered.cam_models import ensemble_proba, model_template
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.core.base import ClientContext
from fednovelty.federated.core.wire import unpack
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.joint_models.joint_scores import learner_log_probs
from fednovelty.federated.joint_models.pfedem import PFedEM, pfedem_predict_proba
from fednovelty.federated.mixtures.fedgengmm import LocalGMMs
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.federated.trust.robust import EXTENSIVE
from fednovelty.mixture import score_samples
from fednovelty.mixture.vb_predictive import vb_predictive_log_prob
from fednovelty.runtime import loop, simulation

OUT = Path(__file__).resolve().parent / "results"
DATASETS = ("4_breastw", "29_Pima", "7_Cardiotocography", "22_magic.gamma")
QUICK_DATASETS = ("4_breastw",)
SEEDS = (0, 1, 2)
N_CLIENTS = 10
ALPHA = 0.5
MAX_TRAIN = 5_000  # training rows kept (a uniform subsample) on the larger sets, for time
#: the attackers' rows: centre FAR training ranges past the maximum, spread SPREAD ranges.
FAR, SPREAD = 3.0, 0.1
CLAIMED_ROWS = 10_000
CLAIMED_TOTAL = 1e12
INCONSISTENT_FACTOR = 50.0
TINY_PRECISION, TINY_ROWS = 1e-75, 10.0
MANY_COMPONENTS = 200_000
N_PLANTED = 200
CAP = 3.0
EM_COMPONENTS = 8  # FedGMMDetector's default n_components
K_RANGE = (1, 10)  # FedGenGMMDetector's default k_range

EM_ATTACKS = ("claim-rows", "claim-1e12", "inconsistent-count", "non-psd")
FEDGEN_ATTACKS = ("claim-rows", "claim-1e12", "tiny-precision", "many-components")
ATTACKS = {"FederatedEM": EM_ATTACKS, "FedGenGMM": FEDGEN_ATTACKS}
QUICK_ATTACKS = {"FederatedEM": ("non-psd",), "FedGenGMM": ("tiny-precision",)}
#: the reference without the attackers: the honest clients alone (defences off).
ABSENT = "absent"
#: (attack, defence) pairs not run, with the reason printed in their place.
NOT_RUN = {
    ("many-components", "off"): "not run: the server would draw 2e7 synthetic rows",
}


# ---------------------------------------------------------------------- defences
@dataclass(frozen=True)
class Defence:
    """One server configuration.

    Attributes:
        name: as written in the tables (``off``, ``validation``, ``cap``, ``trimmed``, ...).
        validate: whether the engine validates replies (``False`` only for ``off``).
        aggregation, trim, cap: the algorithm's ``aggregation``, ``trim`` and
            ``client_weight_cap``.
    """

    name: str
    validate: bool = True
    aggregation: str = "sum"
    trim: float = 0.1
    cap: float | None = None


def defences(algorithm: str, n_attackers: int) -> list[Defence]:
    """The defences run against ``n_attackers`` (0: all of them, to measure their cost).

    ``trimmed T`` trims a share ``T`` of the clients: 0.1 against one attacker, 0.1 (too
    little) and 0.2 against two. ``both T`` is ``trimmed T`` with the cap, at the trim that
    matches the attackers (0.1 per attacker).
    """
    out = [Defence("off", validate=False), Defence("validation"), Defence("cap", cap=CAP)]
    trims = {0: (0.1, 0.2), 1: (0.1,), 2: (0.1, 0.2)}[n_attackers]
    both = {0: (0.1, 0.2), 1: (0.1,), 2: (0.2,)}[n_attackers]
    out += [Defence(f"trimmed {t:g}", aggregation="trimmed", trim=t) for t in trims]
    out += [Defence(f"both {t:g}", aggregation="trimmed", trim=t, cap=CAP) for t in both]
    if algorithm == "FedGenGMM":
        out.append(Defence("median", aggregation="median"))
        out.append(Defence("median+cap", aggregation="median", cap=CAP))
    return out


#: the columns of the summary tables, in order.
DEFENCE_NAMES = (
    "off",
    "validation",
    "cap",
    "trimmed 0.1",
    "trimmed 0.2",
    "both 0.1",
    "both 0.2",
    "median",
    "median+cap",
)


class _AcceptAll:
    """A stand-in for the engine's ``ReplyValidator`` that accepts every reply (``off``)."""

    def __init__(self, n_features: int | None = None) -> None:
        self.n_features = n_features
        self.specs = None  # the loop hands it the algorithm's declarations; unread
        self.private = False  # the loop marks runs whose clients release noisy statistics

    def accept(self, broadcast, replies, widths=None, runs=()):
        return {c: replies[c] for c in sorted(replies)}, {}


@contextmanager
def validation(on: bool) -> Iterator[None]:
    """Run the in-process engine with (``on``) or without its reply validation and the
    first round's gross screen (``fednovelty.federated.trust.plausible``)."""
    if on:
        yield
        return
    with (
        mock.patch.object(simulation, "ReplyValidator", _AcceptAll),
        mock.patch.object(loop, "gross_screen", lambda message, replies: {}),
    ):
        yield


@contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread while the benchmark runs (the caller's setting restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------- algorithms
def make_algorithm(name: str, n_features: int, defence: Defence, seed: int) -> FederatedAlgorithm:
    """``FederatedEM`` / ``FedGenGMM`` with the detectors' defaults and ``defence``'s options."""
    common = {
        "standardize": True,
        "prior_strength": n_features + 2.0,  # prior_strength="auto"
        "prior_scale": PRIOR_SCALE,
        "aggregation": defence.aggregation,
        "trim": defence.trim,
        "client_weight_cap": defence.cap,
        "random_state": seed,
    }
    if name == "FederatedEM":
        return FederatedEM(
            EM_COMPONENTS, mixture_weights="personal", init_params="kmeans", **common
        )
    if name == "FedGenGMM":
        return FedGenGMM(n_components=None, k_range=K_RANGE, **common)
    raise ValueError(f"algorithm must be 'FederatedEM' or 'FedGenGMM', got {name!r}.")


# ---------------------------------------------------------------------- attacks
Forge = Callable[[FederatedAlgorithm, torch.Tensor, Message, ClientContext], Message]


def scaled(reply: Message, factor: float) -> Message:
    """``reply`` with every sum over rows (``EXTENSIVE`` tensors) times ``factor``."""
    if reply.scalars.get("skipped"):
        return reply
    tensors = {k: (v * factor if k in EXTENSIVE else v) for k, v in reply.tensors.items()}
    return Message(reply.kind, tensors, dict(reply.scalars))


def honest(inner, X, message, context) -> Message:
    """Answers about its (made-up) rows as an honest client would."""
    return inner.client_step(X, message, context)


def claim_1e12(inner, X, message, context) -> Message:
    """Every sum over rows scaled so that the client claims ``CLAIMED_TOTAL`` rows."""
    return scaled(inner.client_step(X, message, context), CLAIMED_TOTAL / X.shape[0])


def inconsistent_count(inner, X, message, context) -> Message:
    """Its true row count in its first reply, ``INCONSISTENT_FACTOR`` times more after."""
    reply = inner.client_step(X, message, context)
    if "answered" not in context.state:
        context.state["answered"] = torch.ones(())
        return reply
    return scaled(reply, INCONSISTENT_FACTOR)


def non_psd(inner, X, message, context) -> Message:
    """In EM rounds, the second moment of its fullest component negated."""
    reply = inner.client_step(X, message, context)
    if message.kind != "em" or reply.scalars.get("skipped"):
        return reply
    tensors = dict(reply.tensors)
    second = tensors["second"].clone()
    k = int(tensors["counts"].argmax())
    second[k] = -second[k]
    tensors["second"] = second
    return Message(reply.kind, tensors, dict(reply.scalars))


def tiny_precision(inner, X, message, context) -> Message:
    """Its local mixture with precision factors x ``TINY_PRECISION``, ``TINY_ROWS`` rows."""
    reply = inner.client_step(X, message, context)
    tensors = dict(reply.tensors)
    tensors["precisions_cholesky"] = tensors["precisions_cholesky"] * TINY_PRECISION
    tensors["n_samples"] = torch.tensor(TINY_ROWS, dtype=X.dtype)
    return Message(reply.kind, tensors, {**reply.scalars, "skipped": False})


def many_components(inner, X, message, context) -> Message:
    """A local mixture of ``MANY_COMPONENTS`` unit-covariance components around its rows."""
    k, d = MANY_COMPONENTS, X.shape[1]
    generator = torch.Generator().manual_seed(context.client_id)
    center, spread = X.mean(0), X.std(0).clamp_min(1e-3)
    means = center + spread * torch.randn(k, d, generator=generator, dtype=X.dtype)
    tensors = {
        "weights": torch.full((k,), 1.0 / k, dtype=X.dtype),
        "means": means,
        "precisions_cholesky": torch.eye(d, dtype=X.dtype).expand(k, d, d),
        "n_samples": torch.tensor(float(X.shape[0]), dtype=X.dtype),
    }
    return Message("local_fit", tensors, {"skipped": False, "converged": True, "n_iter": 1})


FORGERS: dict[str, Forge] = {
    "claim-rows": honest,
    "claim-1e12": claim_1e12,
    "inconsistent-count": inconsistent_count,
    "non-psd": non_psd,
    "tiny-precision": tiny_precision,
    "many-components": many_components,
}


class WithAttackers(FederatedAlgorithm):
    """``inner`` with the replies of the ``attackers`` forged by ``forge``.

    Server halves and honest clients run ``inner``'s code unchanged. ``cache`` (a dict
    shared across runs) keeps the replies to ``local_fit`` broadcasts by client, forger,
    rows and broadcast: FedGenGMM's one round is the same for every server configuration, so the
    client fits run once per task.
    """

    def __init__(
        self,
        inner: FederatedAlgorithm,
        attackers: tuple[int, ...],
        forge: Forge,
        cache: dict | None = None,
    ) -> None:
        self.inner, self.attackers, self.forge = inner, set(attackers), forge
        self.max_rounds = inner.max_rounds
        self.cache = cache

    def start(self):
        return self.inner.start()

    def configure(self, state) -> Message:
        return self.inner.configure(state)

    def finished(self, state) -> bool:
        return self.inner.finished(state)

    def server_step(self, state, replies):
        return self.inner.server_step(state, replies)

    def reply_spec(self, kind):
        return self.inner.reply_spec(kind)

    def forge_reply(self, client_id, reply, message, X, context) -> Message:
        """The engine's hook for lying clients: honest clients' replies leave as their
        client gate released them; an attacker sends its forgery past its own (a liar does
        not hold itself to its policy)."""
        if client_id in self.attackers:  # forges the logical broadcast (unpacked)
            return self.forged(X, unpack(message), context)
        return reply

    @property
    def config(self):
        return self.inner.config

    @property
    def gate_caps_weights(self):
        return self.inner.gate_caps_weights

    @property
    def labelled(self) -> bool:
        return getattr(self.inner, "labelled", False)

    def client_step(self, X, message, context) -> Message:
        return self.inner.client_step(X, message, context)

    def client_steps(self, items, message):
        return self.inner.client_steps(items, message)

    def batches(self, kind):
        return self.inner.batches(kind)

    def forged(self, X, message, context) -> Message:
        """An attacker's reply (``forge``), or an honest client's step."""
        attacker = context.client_id in self.attackers
        key = None
        if self.cache is not None and message.kind == "local_fit" and not message.tensors:
            forger = self.forge.__name__ if attacker else None
            key = (context.client_id, forger, id(X), tuple(sorted(message.scalars.items())))
            if key in self.cache:
                return self.cache[key]
        if attacker:
            reply = self.forge(self.inner, X, message, context)
        else:
            reply = self.inner.client_step(X, message, context)
        if key is not None:
            self.cache[key] = reply
        return reply


# ---------------------------------------------------------------------- data
def far_rows(X_train: np.ndarray, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` rows (n, d) around ``max + FAR * range`` of ``X_train``'s features, with
    standard deviation ``SPREAD * range`` per feature."""
    low, high = X_train.min(0), X_train.max(0)
    span = torch.as_tensor(np.maximum(high - low, 1e-3))
    center = torch.as_tensor(high) + FAR * span
    noise = torch.randn(n, X_train.shape[1], generator=generator, dtype=torch.float64)
    return center + SPREAD * span * noise


@dataclass(frozen=True)
class Setting:
    """One task's federation: honest clients, the attackers' rows, planted test rows."""

    task: Task
    clients: list[torch.Tensor]  # the honest clients' rows, by client id (0..9)
    fake: dict[int, dict[str, torch.Tensor]]  # attacker id -> {"many": ..., "median": ...}
    planted: torch.Tensor  # (N_PLANTED, d)


def make_setting(name: str, seed: int, data_dir=None) -> Setting:
    """The task of ``name`` and ``seed`` with each attacker's made-up rows and the planted
    anomalies (attackers' rows are drawn from the training rows of clients 0..7 only)."""
    task = make_task(
        name,
        "novelty",
        n_clients=N_CLIENTS,
        alpha=ALPHA,
        partition="dirichlet",
        seed=seed,
        data_dir=data_dir,
        max_train=MAX_TRAIN,
    )
    clients = [torch.as_tensor(task.X_train[task.groups_train == c]) for c in range(N_CLIENTS)]
    honest_rows = task.X_train[task.groups_train < N_CLIENTS - 2]
    median = int(np.median([c.shape[0] for c in clients[: N_CLIENTS - 2]]))
    generator = torch.Generator().manual_seed(10_000 + seed)
    fake = {
        cid: {
            "many": far_rows(honest_rows, CLAIMED_ROWS, generator),
            "median": far_rows(honest_rows, median, generator),
        }
        for cid in (N_CLIENTS - 1, N_CLIENTS - 2)
    }
    planted = far_rows(honest_rows, N_PLANTED, generator)
    return Setting(task, clients, fake, planted)


def federation(setting: Setting, attack: str | None, n_attackers: int) -> list[torch.Tensor]:
    """The clients' rows: the attackers (the last ``n_attackers`` ids) hold made-up rows;
    with ``attack="absent"`` they take no part (the honest clients alone)."""
    clients = list(setting.clients)
    if attack == ABSENT:
        return clients[: N_CLIENTS - n_attackers]
    for cid in range(N_CLIENTS - n_attackers, N_CLIENTS):
        clients[cid] = setting.fake[cid]["many" if attack == "claim-rows" else "median"]
    return clients


# ---------------------------------------------------------------------- one fit
def evaluate(setting: Setting, params) -> tuple[float, float]:
    """``(auroc, planted_auroc)`` of ``-log p(x)``: the test set, and the planted rows
    against the test inliers."""
    task = setting.task
    X_test = torch.as_tensor(task.X_test)
    novelty = -score_samples(params, X_test).double().numpy()
    planted = -score_samples(params, setting.planted).double().numpy()
    if not (np.isfinite(novelty).all() and np.isfinite(planted).all()):
        return math.nan, math.nan
    inliers = novelty[task.y_test == 0]
    y_planted = np.r_[np.zeros(inliers.size), np.ones(planted.size)]
    return auroc(task.y_test, novelty), auroc(y_planted, np.r_[inliers, planted])


def run_one(
    setting: Setting,
    algorithm: str,
    attack: str | None,
    n_attackers: int,
    defence: Defence,
    cache: dict,
) -> dict:
    """One fit; returns a row of the results table (``error`` names a fit that stopped)."""
    task = setting.task
    row = {
        "dataset": task.name,
        "seed": task.seed,
        "algorithm": algorithm,
        "attack": attack or "none",
        "n_attackers": n_attackers,
        "defence": defence.name,
        "aggregation": defence.aggregation,
        "trim": defence.trim if defence.aggregation != "sum" else math.nan,
        "client_weight_cap": defence.cap if defence.cap is not None else math.nan,
        "validation": defence.validate,
        "auroc": math.nan,
        "planted_auroc": math.nan,
        "dropped": 0,
        "left_out": 0,
        "seconds": math.nan,
        "error": NOT_RUN.get((attack, defence.name), ""),
    }
    if row["error"]:
        return row
    inner = make_algorithm(algorithm, task.n_features, defence, task.seed)
    attackers = tuple(range(N_CLIENTS - n_attackers, N_CLIENTS))
    forge = FORGERS.get(attack, honest)
    wrapped = WithAttackers(inner, attackers, forge, cache)
    clients = federation(setting, attack, n_attackers)
    start = time.perf_counter()
    try:
        with validation(defence.validate), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = simulation.run_simulation(wrapped, clients, random_state=task.seed)
    except Exception as error:  # a fit the attack stopped is a result, not a crash
        row["seconds"] = time.perf_counter() - start
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        return row
    row["seconds"] = time.perf_counter() - start
    row["dropped"] = sum(len(record.dropped) for record in result.history)
    row["left_out"] = len(getattr(result.state, "left_out", []))
    row["auroc"], row["planted_auroc"] = evaluate(setting, result.state.params)
    return row


def grid(algorithms, attacks: dict[str, tuple[str, ...]], attackers=(1, 2)) -> Iterator[tuple]:
    """``(algorithm, attack, n_attackers, defence)`` of every fit of one task."""
    for algorithm in algorithms:
        for defence in defences(algorithm, 0):
            yield algorithm, None, 0, defence
        for n_attackers in attackers:
            yield algorithm, ABSENT, n_attackers, Defence("off", validate=False)
        for attack in attacks[algorithm]:
            for n_attackers in attackers:
                for defence in defences(algorithm, n_attackers):
                    yield algorithm, attack, n_attackers, defence


# ---------------------------------------------------------------------- tables
KEYS = ["dataset", "algorithm", "attack", "n_attackers", "defence"]


def seed_table(df: pd.DataFrame) -> pd.DataFrame:
    """One line per dataset, algorithm, attack, attackers and defence: mean +- std over
    seeds of both AUROCs, the dropped replies and seconds per fit, and any errors."""
    rows = []
    for key, group in df.groupby(KEYS, sort=False):
        errors = sorted({e.split(":")[0] for e in group["error"] if e})
        rows.append(
            {
                **dict(zip(KEYS, key, strict=True)),
                "AUROC": mean_std(group["auroc"], 3, sep=" +- "),
                "planted AUROC": mean_std(group["planted_auroc"], 3, sep=" +- "),
                "dropped": f"{group['dropped'].mean():.1f}",
                "seconds": f"{group['seconds'].mean():.1f}",
                "errors": f"{len(group[group['error'] != ''])}/{len(group)} " + ",".join(errors)
                if errors
                else "",
            }
        )
    return pd.DataFrame(rows)


def cell(group: pd.DataFrame) -> str:
    """``AUROC / planted AUROC`` means over every fit of ``group``; a fit that stopped
    counts as missing and is flagged ``(k stopped)``; ``-`` where none was run."""
    if group.empty:
        return "-"
    if (group["error"].str.startswith("not run")).all():
        return "not run"
    stopped = int((group["error"] != "").sum())
    a, p = group["auroc"].mean(), group["planted_auroc"].mean()
    text = "fit stopped" if stopped == len(group) else f"{a:.2f} / {p:.2f}"
    if 0 < stopped < len(group):
        text += f" ({stopped} stopped)"
    return text


def summary(df: pd.DataFrame) -> str:
    """Markdown: per algorithm, mean AUROC / planted AUROC over datasets and seeds of
    every attack and defence, then the defences' cost with no attack."""
    lines = [
        "# Poisoning: one or two malicious clients of ten",
        "",
        f"Means over {df['dataset'].nunique()} ADBench sets ({', '.join(df['dataset'].unique())})"
        f" x {df['seed'].nunique()} seeds (novelty protocol, {N_CLIENTS} clients, "
        f"Dirichlet({ALPHA})). Each cell: AUROC on the dataset's own test set / AUROC of "
        f"{N_PLANTED} planted anomalies (drawn where the attackers' rows lie) against the "
        "test inliers. 'no attack': the ten honest clients, defences off; 'attackers absent': "
        "the honest clients the attacked federation keeps (8 or 9), alone; '-': not run. "
        "Generated by `python -m benchmarks.poisoning`.",
        "",
    ]
    for algorithm, part in df.groupby("algorithm", sort=False):
        names = [n for n in DEFENCE_NAMES if n in set(part["defence"])]
        baseline = part[(part["attack"] == "none") & (part["defence"] == "off")]
        absent = part[part["attack"] == ABSENT]
        attacked = part[~part["attack"].isin(["none", ABSENT])]
        rows = [
            [attack, n, cell(baseline), cell(absent[absent["n_attackers"] == n])]
            + [cell(group[group["defence"] == name]) for name in names]
            for (attack, n), group in attacked.groupby(["attack", "n_attackers"], sort=False)
        ]
        honest_rows = part[part["attack"] == "none"]
        honest = [cell(honest_rows[honest_rows["defence"] == n]) for n in names]
        lines += [
            f"## {algorithm}",
            "",
            markdown_table(["attack", "attackers", "no attack", "attackers absent", *names], rows),
            "",
            f"Cost on honest federations ({algorithm}, no attack):",
            "",
            markdown_table(names, [honest]),
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the other families
FAMILY_D, FAMILY_ROWS, FAMILY_FAR, FAMILY_FACTOR = 4, 200, 10.0, 1e10
FAMILY_ATTACKS = ("scale-1e10", "far-centroid")
#: families whose first round is federated k-means (the far-centroid attack applies).
KMEANS_FAMILIES = ("FederatedVB", "FederatedKNNMarkers", "ClusteredEM", "JointFedGMM", "PFedEM")
#: the kNN-marker liar's rows: centred ``FAMILY_FAR`` away, ``FAMILY_WIDE`` times as spread
#: (its neighbour distances, the family's feature, ``FAMILY_WIDE`` times the others').
FAMILY_WIDE = 10.0
#: the kNN markers' reference rows: a held-out row's feature is its distance to the
#: ``n_neighbors``-th nearest training row of this (honest) client.
KNN_REFERENCE_CLIENT = 0
#: the kNN markers' score flags a row whose tail probability is below this level: any
#: one posterior's tail probability is monotone in the distance, so the AUROC cannot see
#: what the posterior is, only whether the flags it gives are calibrated.
KNN_LEVEL = 0.01


def family_task(seed: int, liar: str = "", n: int = FAMILY_ROWS, gen=None):
    """Ten clients ``(X, y)`` of three Gaussian classes (centres 0, 4 e_1, 4 e_2, unit
    variance); client 9's rows lie ``FAMILY_FAR`` away in every feature (``liar="far"``,
    for the mixtures) or keep their class centres with labels shifted by one class
    (``liar="labels"``, for the classifiers), or lie ``FAMILY_FAR`` away with ``FAMILY_WIDE``
    times the spread (``liar="wide"``, for the kNN markers); ``""``: honest like the others."""
    gen = gen or torch.Generator().manual_seed(seed)
    centres = torch.zeros(3, FAMILY_D, dtype=torch.float64)
    centres[1, 0] = centres[2, 1] = 4.0
    out = []
    for c in range(N_CLIENTS):
        y = torch.randint(0, 3, (n,), generator=gen)
        X = centres[y] + torch.randn(n, FAMILY_D, generator=gen, dtype=torch.float64)
        if liar == "far" and c == N_CLIENTS - 1:
            X = X - centres[y] + FAMILY_FAR
        elif liar == "wide" and c == N_CLIENTS - 1:
            X = (X - centres[y]) * FAMILY_WIDE + FAMILY_FAR
        elif liar == "labels" and c == N_CLIENTS - 1:
            y = (y + 1) % 3
        out.append((X, y))
    return out


def family_held_out(seed: int):
    """``(X, y_class, X_novelty, y_novel)``: 600 held-out rows of the classes, and for the
    mixtures those rows' first 500 against 100 rows where the liar's lie and 100 in a box."""
    gen = torch.Generator().manual_seed(1000 + seed)
    parts = family_task(seed, n=60, gen=gen)
    X, y = torch.cat([X for X, _ in parts]), torch.cat([y for _, y in parts])
    far = FAMILY_FAR + torch.randn(100, FAMILY_D, generator=gen, dtype=torch.float64)
    box = torch.rand(100, FAMILY_D, generator=gen, dtype=torch.float64) * 20 - 8
    novelty = torch.cat([X[:500], far, box])
    return X, y, novelty, np.r_[np.zeros(500), np.ones(200)]


def scale_1e10(inner, X, message, context) -> Message:
    """Every sum over rows x ``FAMILY_FACTOR``."""
    return scaled(inner.client_step(X, message, context), FAMILY_FACTOR)


def far_centroid(inner, X, message, context) -> Message:
    """Honest, but the first k-means centroid at 1e133."""
    reply = inner.client_step(X, message, context)
    if message.kind != "centroids" or reply.scalars.get("skipped"):
        return reply
    centers = reply.tensors["centers"].clone()
    centers[0] = 1e133
    return Message(reply.kind, {**reply.tensors, "centers": centers}, dict(reply.scalars))


FAMILY_FORGERS: dict[str, Forge] = {"scale-1e10": scale_1e10, "far-centroid": far_centroid}


def _stream_start(seed: int):
    """The nine honest clients' federated EM mixture: every streaming window's start."""
    rows = [X for X, _ in family_task(seed)[: N_CLIENTS - 1]]  # the honest nine
    return simulation.run_simulation(FederatedEM(3, random_state=seed), rows).state.params


def family_options(name: str, option: str) -> dict:
    """The robust settings of ``option`` as family ``name``'s algorithm takes them:
    ``"sum"``, ``"trimmed"`` (at ``trim=0.1``), ``"median"`` or ``"cap"`` (the sum with
    ``client_weight_cap=CAP``); VGM2 names its aggregation ``robust_aggregation``."""
    aggregation = "sum" if option == "cap" else option
    key = "robust_aggregation" if name == "VGM2-fedavg" else "aggregation"
    return {key: aggregation, "client_weight_cap": CAP if option == "cap" else None}


def make_family(name: str, option: str, seed: int) -> FederatedAlgorithm:
    """The family ``name`` on the synthetic task with the robust ``option`` (small
    settings; :func:`family_options`)."""
    robust = family_options(name, option)
    if name == "FederatedVB":
        return FederatedVB(6, random_state=seed, **robust)
    if name == "FederatedVBOneShot":
        return FederatedVBOneShot(6, random_state=seed, **robust)
    if name == "FederatedKNNMarkers":
        return FederatedKNNMarkers(3, max_iter=30, random_state=seed, **robust)
    if name == "ClusteredEM":
        return ClusteredEM(
            2,
            n_clusters=2,
            cluster_components=1,
            warmup=5,
            max_iter=10,
            random_state=seed,
            **robust,
        )
    if name == "LocalGMMs":  # every client keeps its own model: nothing is aggregated
        return LocalGMMs(client_components=3, random_state=seed, **robust)
    if name == "StreamingEM":
        p = _stream_start(seed)
        return StreamingEM(
            3,
            weights_init=p.weights,
            means_init=p.means,
            precisions_init=p.precisions_cholesky,
            rounds=3,
            random_state=seed,
            **robust,
        )
    learning = {"max_iter": 8, "learning_rate": 0.5, **robust}
    if name == "JointFedGMM":
        return JointFedGMM(1, 1, 3, random_state=seed, **learning)
    if name == "PFedEM":
        return PFedEM(3, 3, random_state=seed, **{**learning, "max_iter": 15})
    if name == "VGM2-fedavg":
        return VGM2FedAvg(
            n_features=FAMILY_D,
            n_classes=3,
            rounds=5,
            local_epochs=2,
            hidden=16,
            embedding_dim=4,
            learning_rate=1e-2,
            random_state=seed,
            dtype=torch.float64,
            **robust,
        )
    if name == "ClusteredFL":
        return FedAvgPlus(
            FAMILY_D,
            3,
            n_clusters=2,
            rounds=8,
            learner_factory="linear",
            learning_rate=0.1,
            random_state=seed,
            dtype=torch.float64,
            **robust,
        )
    raise ValueError(f"unknown family {name!r}; choose one of {list(FAMILY_AGGREGATIONS)}.")


#: family -> the robust options it has besides "sum" ("cap": the sum with
#: client_weight_cap=CAP). LocalGMMs aggregates nothing: it has none to run.
FAMILY_AGGREGATIONS: dict[str, tuple[str, ...]] = {
    "FederatedVB": ("trimmed", "cap"),
    "FederatedVBOneShot": ("trimmed", "cap"),
    "FederatedKNNMarkers": ("trimmed", "cap"),
    "ClusteredEM": ("trimmed", "cap"),
    "LocalGMMs": (),
    "StreamingEM": ("trimmed", "cap"),
    "JointFedGMM": ("trimmed", "cap"),
    "PFedEM": ("trimmed", "cap"),
    "VGM2-fedavg": ("trimmed", "median", "cap"),
    "ClusteredFL": ("trimmed", "median", "cap"),
}
#: the unsupervised families (scored by AUROC); the others by accuracy.
MIXTURE_FAMILIES = (
    "FederatedVB",
    "FederatedVBOneShot",
    "FederatedKNNMarkers",
    "ClusteredEM",
    "LocalGMMs",
    "StreamingEM",
)
#: the table's option columns, in order.
FAMILY_OPTIONS = ("sum", "trimmed", "median", "cap")


def knn_feature(seed: int, X: torch.Tensor, config) -> np.ndarray:
    """The kNN markers' feature of rows ``X`` (n, d) under their ``config``: the log
    distance (plus ``distance_floor``) to the ``n_neighbors``-th nearest training row of
    client ``KNN_REFERENCE_CLIENT``, (n,)."""
    reference = family_task(seed)[KNN_REFERENCE_CLIENT][0]
    nearest = torch.cdist(X, reference).topk(config.n_neighbors, largest=False).values
    return torch.log(nearest[:, -1] + config.distance_floor).numpy()


def mixture_novelty(name: str, algorithm: FederatedAlgorithm, state, X: torch.Tensor, seed: int):
    """``-log p(x)`` (or the kNN markers' ``-log`` tail probability) of rows ``X`` under a
    mixture family's final ``state``, (n,); LocalGMMs: one column per client model,
    (n, n_models) in client-id order."""
    if name in ("FederatedVB", "FederatedVBOneShot"):
        return -vb_predictive_log_prob(X, state.posterior).numpy()
    if name == "FederatedKNNMarkers":
        values = knn_feature(seed, X, algorithm.config)
        return -predictive_log_tail(values, state.posterior)
    if name == "LocalGMMs":
        models = [state.client_models[c] for c in sorted(state.client_models)]
        return np.column_stack([-score_samples(m, X).numpy() for m in models])
    return -score_samples(state.params, X).numpy()


def family_score(name: str, algorithm: FederatedAlgorithm, state, seed: int) -> dict:
    """``{"score": ...}``: the AUROC (mixtures) or accuracy (classifiers) of a final
    ``state`` on held-out rows. The kNN markers: the balanced accuracy (mean of the shares
    of anomalies and of inliers classed right) of flagging a tail probability below
    ``KNN_LEVEL``. LocalGMMs: the mean AUROC of the honest clients' own models (``score``)
    and the liar's own model's (``liar_score``)."""
    X, y, novelty, y_novel = family_held_out(seed)
    if name in MIXTURE_FAMILIES:
        scores = mixture_novelty(name, algorithm, state, novelty, seed)
        if name == "FederatedKNNMarkers":  # balanced accuracy of the flags (KNN_LEVEL)
            flagged = scores > -math.log(KNN_LEVEL)
            return {"score": 0.5 * (flagged[y_novel == 1].mean() + (~flagged[y_novel == 0]).mean())}
        if name != "LocalGMMs":
            return {"score": auroc(y_novel, scores)}
        ids = sorted(state.client_models)
        per_model = {c: auroc(y_novel, scores[:, i]) for i, c in enumerate(ids)}
        liar = per_model.pop(N_CLIENTS - 1, math.nan)
        return {"score": float(np.mean(list(per_model.values()))), "liar_score": liar}
    if name == "JointFedGMM":
        proba = learner_log_probs(algorithm._template(FAMILY_D), state.learners, X)[:, 0]
    elif name == "PFedEM":
        template = algorithm._template(FAMILY_D)
        proba = pfedem_predict_proba(template, state.learners, X, state.params.weights)
    elif name == "VGM2-fedavg":
        config = algorithm.config
        Z = embed(encoder_template(config), state.global_encoder, X)
        proba = torch.func.functional_call(head_template(config), state.global_head, (Z,))
    else:
        proba = ensemble_proba(model_template(algorithm.config), state, X)
    return {"score": float((proba.argmax(1) == y).double().mean())}


def family_liar(name: str, attack: str) -> str:
    """How client 9's rows differ (:func:`family_task`): none when it is honest."""
    if attack == "none":
        return ""
    if name == "FederatedKNNMarkers":
        return "wide"
    return "far" if name in MIXTURE_FAMILIES else "labels"


def run_family(name: str, attack: str, aggregation: str, seed: int) -> dict:
    """One fit of the families' grid; ``attack`` ``"none"`` (the liar honest),
    ``"absent"`` (the nine honest clients alone) or one of ``FAMILY_ATTACKS``."""
    row = {"family": name, "attack": attack, "aggregation": aggregation, "seed": seed}
    data = family_task(seed, liar=family_liar(name, attack))
    if attack == ABSENT:
        data = data[: N_CLIENTS - 1]
    if name in MIXTURE_FAMILIES:
        data = [X for X, _ in data]
    inner = make_family(name, aggregation, seed)
    forge = FAMILY_FORGERS.get(attack)
    algorithm = WithAttackers(inner, (N_CLIENTS - 1,), forge) if forge else inner
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = simulation.run_simulation(algorithm, data, random_state=seed).state
        row.update(family_score(name, inner, state, seed), error="")
    except Exception as error:  # a fit the attack stopped is a result
        row["score"] = math.nan
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    row["seconds"] = time.perf_counter() - start
    return row


def family_grid(families, seeds) -> Iterator[tuple[str, str, str, int]]:
    """``(family, attack, aggregation, seed)`` of every fit of the families' grid."""
    for name in families:
        aggregations = ("sum", *FAMILY_AGGREGATIONS[name])
        attacks = [a for a in FAMILY_ATTACKS if a != "far-centroid" or name in KMEANS_FAMILIES]
        for seed in seeds:
            yield name, ABSENT, "sum", seed
            for attack in ("none", *attacks):
                for aggregation in aggregations:
                    yield name, attack, aggregation, seed


def family_summary(df: pd.DataFrame) -> str:
    """Markdown: per family and attack, the mean score over seeds of each aggregation, the
    reference without the liar beside it."""
    lines = [
        "# Poisoning: the other families, one liar of ten",
        "",
        f"Synthetic task (three Gaussian classes, d={FAMILY_D}, {N_CLIENTS} clients of "
        f"{FAMILY_ROWS} rows), means over {df['seed'].nunique()} seed(s). Score: AUROC "
        f"({', '.join(m for m in MIXTURE_FAMILIES if m != 'FederatedKNNMarkers')}) or "
        "accuracy (the classifiers); FederatedKNNMarkers: the balanced accuracy of flagging "
        f"tail probabilities below {KNN_LEVEL:g} (its tail probability is monotone in the "
        "distance: an AUROC would not see the posterior); LocalGMMs aggregates nothing: its "
        "score is the mean AUROC of the honest clients' own models. "
        "'liar absent': the nine honest clients alone; 'none': the liar's client honest "
        f"(the options' cost); 'cap': the sum with client_weight_cap={CAP:g}; '-': an "
        "option the family does not have. 'stopped': the fit raised. Generated by "
        "`python -m benchmarks.poisoning --families`.",
        "",
    ]

    def text(rows: pd.DataFrame) -> str:
        if rows.empty:
            return "-"
        stopped = int((rows["error"] != "").sum())
        if stopped == len(rows):
            return "stopped"
        value = f"{rows['score'].mean():.3f}"
        return value + (f" ({stopped} stopped)" if stopped else "")

    table = []
    for name, part in df.groupby("family", sort=False):
        absent = text(part[part["attack"] == ABSENT])
        for attack, rows in part[part["attack"] != ABSENT].groupby("attack", sort=False):
            cells = [text(rows[rows["aggregation"] == a]) for a in FAMILY_OPTIONS]
            table.append([name, attack, absent, *cells])
    lines.append(markdown_table(["family", "attack", "liar absent", *FAMILY_OPTIONS], table))
    if "liar_score" in df:
        own = df[(df["family"] == "LocalGMMs") & ~df["attack"].isin(["none", ABSENT])]
        by_attack = own.groupby("attack", sort=False)["liar_score"].mean()
        lines += [
            "",
            "LocalGMMs, the liar's own model (its rows lie where the anomalies are): AUROC "
            + ", ".join(f"{v:.3f} ({a})" for a, v in by_attack.items())
            + "; no other client's model depends on it.",
        ]
    return "\n".join(lines)


def main_families(args) -> pd.DataFrame:
    """The families' grid: print and write ``poisoning_families.csv`` / ``.md``."""
    seeds = args.seeds or ((0,) if args.quick else SEEDS)
    families = args.families_only or (
        ("FederatedVB", "ClusteredFL") if args.quick else tuple(FAMILY_AGGREGATIONS)
    )
    started = time.perf_counter()
    with one_thread():
        df = pd.DataFrame([run_family(*key) for key in family_grid(families, seeds)])
    report = family_summary(df)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "poisoning_families.csv", index=False)
    (args.out / "poisoning_families.md").write_text(report + "\n")
    print(report)
    print(f"\n{len(df)} fits in {time.perf_counter() - started:.0f} s")
    return df


# ---------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 4_breastw, seed 0, two attackers, one attack per algorithm",
    )
    parser.add_argument("--attackers", type=int, nargs="+", default=None, choices=(1, 2))
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--algorithms", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--families",
        action="store_true",
        help="the other families (FedVB, one-shot VB, kNN markers, clustered EM, local "
        "GMMs, streaming, joint, pFedEM, VGM2-fedavg, ClusteredFL)",
    )
    parser.add_argument(
        "--families-only", nargs="+", default=None, choices=list(FAMILY_AGGREGATIONS)
    )
    add_out(parser, default=OUT)
    return parser.parse_args(argv)


def main(argv=None) -> pd.DataFrame:
    """Run the grid, print the per-task table, write ``poisoning.csv`` and ``poisoning.md``
    to ``--out``; returns every fit's row."""
    args = parse_args(argv)
    if args.families:
        return main_families(args)
    datasets = args.datasets or (QUICK_DATASETS if args.quick else DATASETS)
    seeds = args.seeds or ((0,) if args.quick else SEEDS)
    attacks = QUICK_ATTACKS if args.quick else ATTACKS
    attackers = args.attackers or ((2,) if args.quick else (1, 2))
    rows = []
    started = time.perf_counter()
    with one_thread():
        for name in datasets:
            for seed in seeds:
                setting = make_setting(name, seed, args.data_dir)
                cache: dict = {}
                for algorithm, attack, n, defence in grid(args.algorithms, attacks, attackers):
                    rows.append(run_one(setting, algorithm, attack, n, defence, cache))
                print(
                    f"{name} seed {seed}: done at {time.perf_counter() - started:.0f} s",
                    flush=True,
                )
    df = pd.DataFrame(rows)
    table = seed_table(df)
    with pd.option_context("display.width", 250, "display.max_rows", None):
        print(table.to_string(index=False))
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "poisoning.csv", index=False)
    report = summary(df)
    (args.out / "poisoning.md").write_text(report + "\n")
    print()
    print(report)
    print(f"\n{len(df)} fits in {time.perf_counter() - started:.0f} s")
    return df


if __name__ == "__main__":
    main()
