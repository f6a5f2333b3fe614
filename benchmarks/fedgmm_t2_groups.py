"""FedGMM Table 2 on the reference code's data, per client group: where the Gaussian clients'
and the Beta clients' rows go inside one FedGMM fit and one FedEM fit, and why.

Run ``python -m benchmarks.fedgmm_t2_groups --paper-scale`` (300 clients, 200 rounds, seed 0;
about 20 minutes on one core), ``--clients 30 --rounds 50`` (the 30-client run of the same
generator), or ``--quick`` (8 clients, 5 rounds: a smoke run). ``--seed S`` picks the seed,
``--out FILE`` also writes the markdown report.

Data and models are :mod:`benchmarks.fedgmm_pfl`'s (``--data reference``): the generator
:func:`~fednovelty.datasets.synthetic_reference.make_fedgmm_reference_synthetic`, whose last
10 clients (a third of them below 30 clients) are "Beta clients" (raw Beta rows in
``[0, 1]^32``, three Beta components with labelling rules of their own); the others are
"Gaussian clients". FedGMM (3 Gaussians, 3 learners) and FedEM (1 Gaussian, 3 learners) are
fitted on every client, with that script's settings and the same seed. Local is fitted on the
Beta clients' rows alone (a Local learner only ever sees its own client's rows).

The report, from the fitted attributes:

1. Gaussians (FedGMM): each group's mean responsibility per Gaussian over its test rows, each
   row under its own client's Gaussian weights (``responsibilities(X, client=c)``); how many
   Gaussians hold 90 % of the Beta rows' mass; each Gaussian's fitted mass
   ``sum_c n_c client_weights_[c]`` and the Beta clients' share of it.
2. Personal weights over the learners: each group's mean over clients of
   ``sum_m1 client_joint_weights_[c, m1, :]``.
3. Each learner alone (``learner_template_`` with ``joint_state_.learners[k]``) on each
   group's test rows, beside the personal mixture (``predict_y(X, client=c)``) and, per Beta
   client, the best single learner.
4. Per Beta client: training rows, its largest Beta component's weight, the majority label's
   share of its test rows, FedGMM, FedEM, Local, FedGMM's best single learner, and how many
   distinct labels FedGMM predicts on its test rows; the last row is the unweighted mean over
   the Beta clients.
5. Can one linear rule fit the Beta rows? A logistic regression (scikit-learn, ``C=1000``)
   fitted centrally on all Beta clients' training rows, and one per Beta component (the
   generator's component labels), scored on the Beta test rows.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from torch.func import functional_call

from benchmarks.common import command_line, emit_report, markdown_table, report_header
from benchmarks.fedgmm_pfl import Settings, add_scale, beta_clients, make_data, make_model, scale_of
from fednovelty.datasets.synthetic import FederatedSplit

GROUPS = ("Gaussian clients", "Beta clients")
#: the mass share that counts a group's rows as "mostly" on a set of Gaussians.
MOSTLY = 0.9
#: the probe's logistic regressions: barely regularised (rows in [0, 1]^32).
PROBE_C = 1000.0


@dataclass
class Diagnosis:
    """The numbers of one seed's report; arrays are indexed by group (0 Gaussian, 1 Beta),
    Gaussian ``m1`` and learner ``m2`` (FedGMM: M1 = M2 = 3; FedEM: M1 = 1).

    Attributes:
        n_clients, n_rounds, seed: the run; beta: the Beta clients' ids (n_beta,).
        train_rows: (2,) training rows per group.
        test_mass: (2, M1) mean responsibility per Gaussian over the group's test rows.
        fitted_mass: (2, M1) ``sum_c n_c client_weights_[c]`` over the group's clients.
        learner_weights: {method: (2, M2)} mean personal weight per learner.
        learner_accuracy: {method: (2, M2)} each learner alone, % of the group's test rows.
        personal_accuracy: {method: (2,)} the personal mixture, %.
        per_client: one dict per Beta client (see :func:`beta_client_rows`).
        probe: {"one rule": %, "one rule per component": %, "majority": %} on Beta test rows.
        seconds: {method: fit seconds}.
    """

    n_clients: int
    n_rounds: int
    seed: int
    beta: np.ndarray
    train_rows: np.ndarray
    test_mass: np.ndarray
    fitted_mass: np.ndarray
    learner_weights: dict
    learner_accuracy: dict
    personal_accuracy: dict
    per_client: list
    probe: dict
    seconds: dict


# ----------------------------------------------------------------------------- pure helpers
def group_index(groups: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """(n,) 0 for a Gaussian client's row, 1 for a Beta client's; ``groups`` (n,) ids."""
    return np.isin(groups, beta).astype(np.int64)


def mostly_on(mass: np.ndarray, share: float = MOSTLY) -> int:
    """The fewest Gaussians whose mass (M1,) sums to ``share`` of the total."""
    ordered = np.sort(mass)[::-1].cumsum() / mass.sum()
    return int(np.searchsorted(ordered, share - 1e-12) + 1)


def group_means(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """(2, ...) mean of ``values`` (n, ...) over the rows of each group ``index`` (n,)."""
    return np.stack([values[index == g].mean(0) for g in (0, 1)])


def majority_share(y: np.ndarray) -> float:
    """The most frequent label's share of ``y`` (n,), in %."""
    return 100.0 * np.bincount(y).max() / len(y)


def learner_predictions(model, X: np.ndarray) -> np.ndarray:
    """(M2, n) each shared learner's label for rows ``X`` (n, d), alone."""
    rows = torch.as_tensor(X, dtype=torch.float64)
    with torch.no_grad():
        logits = [
            functional_call(model.learner_template_, params, (rows,))
            for params in model.joint_state_.learners
        ]
    return model.classes_[torch.stack(logits).argmax(2).numpy()]


def personal_predictions(model, X: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(n,) each row's label under its own client's weights (``predict_y(client=c)``)."""
    out = np.empty(len(groups), dtype=np.int64)
    for c in np.unique(groups):
        rows = groups == c
        out[rows] = model.predict_y(X[rows], client=int(c))
    return out


def client_rows(model, groups: np.ndarray) -> np.ndarray:
    """(n_clients,) training rows of each client, in ``client_ids_`` order."""
    return np.array([(groups == c).sum() for c in model.client_ids_])


# ----------------------------------------------------------------------------- fits
def fit(name: str, settings: Settings, seed: int, X, y, groups):
    """``(model, seconds)``: :mod:`benchmarks.fedgmm_pfl`'s ``name`` fitted on the rows."""
    model = make_model(name, settings, seed)
    start = time.perf_counter()
    model.fit(X, y, groups=groups)
    return model, time.perf_counter() - start


def diagnose(settings: Settings, seed: int) -> Diagnosis:
    """Fit FedGMM and FedEM on every client and Local on the Beta clients; measure."""
    data = make_data(settings, seed)
    beta = beta_clients(settings)
    g_train = group_index(data.groups_train, beta)
    g_test = group_index(data.groups_test, beta)
    models, seconds = {}, {}
    for name in ("FedGMM", "FedEM"):
        models[name], seconds[name] = fit(
            name, settings, seed, data.X_train, data.y_train, data.groups_train
        )
        print(f"  seed {seed} {name} fitted in {seconds[name]:.0f} s", flush=True)
    on_beta = g_train == 1
    beta_rows = (data.X_train[on_beta], data.y_train[on_beta], data.groups_train[on_beta])
    local, seconds["Local"] = fit("Local", settings, seed, *beta_rows)
    gmm = models["FedGMM"]
    resp = np.empty((len(g_test), gmm.n_components_))
    for c in np.unique(data.groups_test):
        rows = data.groups_test == c
        resp[rows] = gmm.responsibilities(data.X_test[rows], client=int(c))
    is_beta_client = np.isin(gmm.client_ids_, beta).astype(np.int64)
    weighted = client_rows(gmm, data.groups_train)[:, None] * gmm.client_weights_
    fitted_mass = np.stack([weighted[is_beta_client == g].sum(0) for g in (0, 1)])
    weights, acc, personal, pred = {}, {}, {}, {}
    for name, model in models.items():
        per_learner = model.client_joint_weights_.sum(1)  # (n_clients, M2)
        weights[name] = np.stack([per_learner[is_beta_client == g].mean(0) for g in (0, 1)])
        right = learner_predictions(model, data.X_test) == data.y_test  # (M2, n)
        acc[name] = 100.0 * group_means(right.T.astype(float), g_test)
        pred[name] = personal_predictions(model, data.X_test, data.groups_test)
        personal[name] = 100.0 * group_means((pred[name] == data.y_test).astype(float), g_test)
    on_test = g_test == 1
    pred["Local"] = np.zeros(len(g_test), dtype=np.int64)
    pred["Local"][on_test] = personal_predictions(
        local, data.X_test[on_test], data.groups_test[on_test]
    )
    return Diagnosis(
        n_clients=settings.n_clients,
        n_rounds=settings.max_iter,
        seed=seed,
        beta=beta,
        train_rows=np.bincount(g_train, minlength=2),
        test_mass=group_means(resp, g_test),
        fitted_mass=fitted_mass,
        learner_weights=weights,
        learner_accuracy=acc,
        personal_accuracy=personal,
        per_client=beta_client_rows(data, beta, pred, learner_predictions(gmm, data.X_test)),
        probe=linear_probe(data, on_beta, on_test),
        seconds=seconds,
    )


def beta_client_rows(data: FederatedSplit, beta, pred: dict, learners: np.ndarray) -> list:
    """Per Beta client: ``client``, ``train`` rows, ``top_component`` (its largest Beta
    component weight, %), ``majority`` %, accuracy % of ``FedGMM``, ``FedEM``, ``Local``,
    ``best learner`` (FedGMM's best single learner) and ``labels`` (distinct labels FedGMM
    predicts). ``pred`` {method: (n_test,)}, ``learners`` (M2, n_test)."""
    out = []
    for c in beta:
        rows = data.groups_test == c
        y = data.y_test[rows]
        row = {
            "client": int(c),
            "train": int((data.groups_train == c).sum()),
            "top_component": 100.0 * float(data.client_weights[c].max()),
            "majority": majority_share(y),
        }
        for name in ("FedGMM", "FedEM", "Local"):
            row[name] = 100.0 * float(np.mean(pred[name][rows] == y))
        row["best learner"] = 100.0 * float((learners[:, rows] == y).mean(1).max())
        row["labels"] = int(np.unique(pred["FedGMM"][rows]).size)
        out.append(row)
    return out


def linear_probe(data: FederatedSplit, on_train: np.ndarray, on_test: np.ndarray) -> dict:
    """Accuracy % on the Beta test rows of one logistic regression on all Beta training rows
    and of one per Beta component (rows routed by the generator's component labels)."""
    X, y, z = data.X_train[on_train], data.y_train[on_train], data.components_train[on_train]
    Xt, yt, zt = data.X_test[on_test], data.y_test[on_test], data.components_test[on_test]

    def rule(rows: np.ndarray):
        if np.unique(y[rows]).size < 2:  # one label: predict it
            return lambda A: np.full(len(A), y[rows][0])
        return LogisticRegression(C=PROBE_C, max_iter=5000).fit(X[rows], y[rows]).predict

    right = rule(np.ones(len(y), bool))(Xt) == yt
    routed = np.empty(len(yt), bool)
    for k in np.unique(zt):
        fitted = rule(z == k) if (z == k).any() else (lambda A: np.full(len(A), -1))
        routed[zt == k] = fitted(Xt[zt == k]) == yt[zt == k]
    return {
        "one rule": 100.0 * float(right.mean()),
        "one rule per component": 100.0 * float(routed.mean()),
        "majority": majority_share(yt),
    }


# ----------------------------------------------------------------------------- report
def percent(values) -> list[str]:
    return [f"{100.0 * v:.1f}" for v in values]


def report(d: Diagnosis) -> str:
    """The markdown sections of :class:`Diagnosis` ``d`` (see the module doc)."""
    m1 = d.test_mass.shape[1]
    share = d.fitted_mass[1] / d.fitted_mass.sum(0)
    mass_rows = [
        [
            GROUPS[g],
            f"{d.train_rows[g]} ({100 * d.train_rows[g] / d.train_rows.sum():.1f} %)",
            *percent(d.test_mass[g]),
            mostly_on(d.test_mass[g]),
        ]
        for g in (0, 1)
    ]
    mass_rows.append(["Beta share of the fitted mass", "", *percent(share), ""])
    lines = [
        f"## Client groups: {d.n_clients} clients ({len(d.beta)} Beta clients), "
        f"{d.n_rounds} rounds, seed {d.seed}",
        "",
        "### 1. FedGMM's Gaussians: mean responsibility % of each group's test rows",
        "",
        markdown_table(
            [
                "group",
                "training rows",
                *[f"Gaussian {k}" for k in range(m1)],
                f"Gaussians holding {MOSTLY:.0%}",
            ],
            mass_rows,
        ),
        "",
        "### 2. Personal weights over the learners (mean over the group's clients, %)",
        "",
    ]
    m2 = d.learner_weights["FedGMM"].shape[1]
    learners = [f"learner {k}" for k in range(m2)]
    rows = [
        [name, GROUPS[g], *percent(d.learner_weights[name][g])]
        for name in d.learner_weights
        for g in (0, 1)
    ]
    lines += [markdown_table(["method", "group", *learners], rows), ""]
    lines += ["### 3. Accuracy % of each learner alone and of the personal mixture", ""]
    rows = [
        [
            name,
            GROUPS[g],
            *[f"{v:.1f}" for v in d.learner_accuracy[name][g]],
            f"{d.personal_accuracy[name][g]:.1f}",
        ]
        for name in d.learner_accuracy
        for g in (0, 1)
    ]
    lines += [markdown_table(["method", "group", *learners, "personal"], rows), ""]
    keys = ("train", "top_component", "majority", "FedGMM", "FedEM", "Local", "best learner")
    rows = [
        [
            r["client"],
            *[f"{r[k]:.1f}" if isinstance(r[k], float) else r[k] for k in keys],
            r["labels"],
        ]
        for r in d.per_client
    ]
    mean = [np.mean([r[k] for r in d.per_client]) for k in keys[2:]]
    rows.append(["mean", "", "", *[f"{v:.1f}" for v in mean], ""])
    lines += [
        "### 4. The Beta clients one by one (accuracy % of their test rows)",
        "",
        markdown_table(
            [
                "client",
                "training rows",
                "largest component %",
                "majority label",
                "FedGMM",
                "FedEM",
                "Local",
                "FedGMM best learner",
                "labels FedGMM predicts",
            ],
            rows,
        ),
        "",
        "### 5. One linear rule on the Beta rows (logistic regression, centralised)",
        "",
        markdown_table(
            ["fitted on", "accuracy % on the Beta test rows"],
            [
                ["all Beta training rows, one rule", f"{d.probe['one rule']:.1f}"],
                ["one rule per Beta component", f"{d.probe['one rule per component']:.1f}"],
                ["(majority label of the Beta test rows)", f"{d.probe['majority']:.1f}"],
            ],
        ),
        "",
        "Fit seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in d.seconds.items()) + ".",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the one seed (0)")
    add_scale(parser, "8 clients, 5 rounds")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = Settings(*scale_of(args), (args.seed,), data="reference")
    start = time.perf_counter()
    body = report(diagnose(settings, args.seed))
    title = "FedGMM Table 2 on the reference data, per client group"
    header = report_header(
        title, command_line("fedgmm_t2_groups", argv), args.quick, time.perf_counter() - start
    )
    return emit_report(header + "\n\n" + body, args.out)


if __name__ == "__main__":
    main()
