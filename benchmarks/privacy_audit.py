"""Privacy audit of whole detector fits: a seed-knowing membership attack on the released
model, its AUC beside the bounds the claimed (epsilon, delta) implies, and an empirical
epsilon lower bound.

**Threat model.** The adversary knows every training row but one canary, the client that
holds the canary, the algorithm, every setting and ``random_state``; it sees the fitted
model (what the detector exposes: ``weights_``, ``means_``, ``covariances_``, and for the
joint model its learners), and it can run the fit itself on the rows it knows. The canary
is the worst row a public adversary can plant: the corner ``(BOX, BOX)`` of the public
box, far from every cluster of the data; in the box's units it has norm ``sqrt(d)``, the
clipping radius of ``Privacy.clip="auto"`` (in z-scores, with ``Prior.standardize``, it lies beyond
the radius and is clipped onto it), so it moves every released block by its full
sensitivity. The clients' individual replies (visible to the server in ``"local"`` and
``"distributed"`` mode) are not attacked here: :func:`fednovelty.evaluation.membership.
gate_attack` audits single releases; this script audits what a fit finally releases.

**Experiment.** One federation of ``CLIENTS`` (10) clients of ``ROWS`` (100) rows of
``D = 2`` features: three Gaussian clusters (centres ``CENTRES``, spread ``SPREAD``) clipped
into the public box ``[-BOX, BOX]^2`` (the generating range, known without the rows:
``Privacy.bounds``). Every fit uses the same rows and the same ``random_state`` (``SEED``): ``T``
fits with the canary appended to client 0 (members) and ``T`` without (non-members), plus
``--shadows`` (S) fits of each kind that the adversary runs itself (same rows, same seed),
kept apart from the scored fits.

**Attack (a likelihood-ratio test).** The statistic of a released model is the log-density
it gives the canary, ``s = log p(canary)`` (``score_samples``; for the joint model
``log p(canary, label)``, ``log_pxy`` with the global weights): one number through which
every released parameter (weights, means, covariances, learners) acts on the canary, and
the loss that membership attacks on generative models threshold. The score is the online LiRA of
Carlini et al. (2022) with a fixed variance: Gaussians fitted to ``s`` over the shadow fits
with (mean ``m1``) and without the canary (``m0``), one pooled spread ``sd``, and the score
``log N(s; m1, sd) - log N(s; m0, sd) = (m1 - m0) (s - (m0 + m1) / 2) / sd^2``: the
Neyman-Pearson test between the two hypotheses under that Gaussian model, whichever
direction the canary moves ``s``. A spread of zero (every shadow fit alike: the fit is a
function of the rows and the seed) is floored at ``1e-9`` of the statistic's scale, so any
difference from the adversary's own canary-free fit names a member. Members and non-members
of the scored fits are the add/remove-one-row pair DP's guarantee is stated for.

**Figures, per mode.** (a) The attack's AUC (members positive) with a 95 % percentile
bootstrap interval, beside the largest AUC any attack has against an ``(epsilon, delta)``-DP
mechanism (:func:`~fednovelty.evaluation.membership_bounds.dp_auc_bound`) and against the Gaussian
mechanism of the same budget, ``gdp_auc_bound(gdp_mu_for_epsilon(epsilon, delta))`` (the
fits compose Gaussian mechanisms; DP-SGD's subsampled steps only approximately so, where the
``(epsilon, delta)`` bound is the rigorous one). (b) The empirical epsilon lower bound
(:func:`~fednovelty.evaluation.membership_audit.epsilon_lower_bound`, Jagielski et al. 2020,
Nasr et al. 2021): ``max(log((1 - delta - FNR_up) / FPR_up), log((1 - delta - FPR_up) /
FNR_up))`` with 95 % Clopper-Pearson upper ends of the error rates. The held-out column is a
valid 95 % bound: threshold and direction chosen on the even-numbered trials, rates counted
on the odd ones; the best-threshold column uses every trial and the best of all thresholds
(the usual estimate; optimistic, it picks the best of many tests). With ``n`` trials per
side and no error the bound is at most ``log((1 - u) / u)``, ``u = 1 - 0.025^(1/n)``
(3.28 at ``n = 100``, 2.57 at 50): an audit this size can only catch a privacy failure,
not show that epsilon = 1 is tight. ``distinct models`` counts the different released models
among the non-member and member fits (one each when the fit, noise included, is a function
of the rows and ``random_state``).

**Modes** (``--modes``; epsilon = 1, delta = 1e-5, ``Privacy.bounds`` the public box):
``none`` (``FedGMMDetector`` without DP: the sanity row, AUC near 1), ``central``,
``local``, ``distributed`` (``FedGMMDetector(mixture_weights="global",
privacy=Privacy(mode=...))``, 3
components, 3 k-means and 5 EM rounds, the defaults otherwise: standardisation, prior,
``clip="auto"``), ``joint-dpsgd`` (``JointFedGMMDetector``: 3 Gaussians, one linear
learner trained by DP-SGD (sample rate 0.2, one local epoch, clip 1, half the budget), 2
k-means and 3 EM rounds, central noise on the statistics; labels: 1 for the clusters at
``(2, -2)`` and ``(-2, 2)``, 0 for ``(-2, -2)``; the canary carries label 0, which a model
without it gives its corner least).

**Checkpoints.** Every finished fit appends one JSON line (mode, role ``trial`` or
``shadow``, member flag, index, the statistic, a digest of the released model, seconds) to
``--out``/``scores-<fingerprint>.jsonl``, with a hash of the mode's settings (the data's and
every parameter of its detector). The file's fingerprint hashes the ``fednovelty`` package's
source: a rerun on the same code skips the finished fits of unchanged modes, a rerun on
changed code starts afresh.

Usage::

    .venv/bin/python -m benchmarks.privacy_audit                 # T = 100, all modes, ~9 min
    .venv/bin/python -m benchmarks.privacy_audit --trials 20 --modes central none
    .venv/bin/python -m benchmarks.privacy_audit --out /tmp/audit --report /tmp/audit.txt
    .venv/bin/python -m benchmarks.privacy_audit --quick --modes none   # smoke run, seconds

Options: ``--trials T`` (fits per side, default 100), ``--shadows S`` (default 16),
``--modes`` (default all), ``--out DIR`` (checkpoints, default
``benchmarks/results/privacy_audit``), ``--report FILE`` (the table, default
``benchmarks/privacy_audit.txt``), ``--quick`` (the smoke run: 2 trials and 2 shadows a
side, checkpoints in a scratch folder unless ``--out``, the report written only with
``--report``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

import fednovelty
from benchmarks.common import (
    add_out,
    add_quick,
    command_line,
    emit_report,
    report_header,
    with_options,
)
from fednovelty.detectors import FedGMMDetector, JointFedGMMDetector
from fednovelty.detectors.options import Initialisation, Privacy
from fednovelty.evaluation.membership_audit import (
    EpsilonLowerBound,
    auc_interval,
    epsilon_lower_bound,
)
from fednovelty.evaluation.membership_bounds import dp_auc_bound, gdp_auc_bound, gdp_mu_for_epsilon

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EPSILON, DELTA = 1.0, 1e-5
#: every fit's random_state (the adversary knows it).
SEED = 0
#: the data's seed (rows, cluster labels).
DATA_SEED = 0
D, CLIENTS, ROWS = 2, 10, 100
#: the public box of every feature: the data's generating range.
BOX = 4.0
CENTRES = ((-2.0, -2.0), (2.0, -2.0), (-2.0, 2.0))
SPREAD = 0.6
#: the canary: the box's corner, far from every cluster; its label for the joint model.
CANARY = (BOX, BOX)
CANARY_LABEL = 0
DEFAULT_TRIALS = 100
DEFAULT_SHADOWS = 16
MODES = ("none", "central", "local", "distributed", "joint-dpsgd")
LEVEL = 0.95
N_BOOT = 1000
#: FedGMMDetector's settings in every mode (DP settings added per mode).
FEDGMM = {
    "n_components": 3,
    "mixture_weights": "global",
    "max_iter": 5,
    "initialisation": Initialisation(kmeans_rounds=3),
    "random_state": SEED,
}
#: JointFedGMMDetector's settings (DP-SGD learners).
JOINT = {
    "n_components": 3,
    "n_learners": 1,
    "learner": "linear",
    "local_epochs": 1,
    "max_iter": 3,
    "initialisation": Initialisation(kmeans_rounds=2),
    "tol": 0.0,
    "random_state": SEED,
}
#: the learners' DP-SGD sample rate of the joint model's private fits.
JOINT_SAMPLE_RATE = 0.2
#: what every mode's fits share (a checkpointed fit counts only under the same).
SETTINGS = {
    "epsilon": EPSILON,
    "delta": DELTA,
    "seed": SEED,
    "data_seed": DATA_SEED,
    "shape": (D, CLIENTS, ROWS),
    "box": BOX,
    "centres": CENTRES,
    "spread": SPREAD,
    "canary": (CANARY, CANARY_LABEL),
}
Data = tuple[np.ndarray, np.ndarray, np.ndarray]


# --------------------------------------------------------------------------- data and fits
def make_data(seed: int = DATA_SEED) -> Data:
    """``(X, y, groups)``: ``CLIENTS * ROWS`` rows (n_samples, D) of the three clusters
    clipped into the public box, labels (n_samples,) (0 for the first cluster, 1 for the
    others) and client ids (n_samples,)."""
    rng = np.random.default_rng(seed)
    n = CLIENTS * ROWS
    cluster = rng.integers(0, len(CENTRES), n)
    X = np.clip(np.asarray(CENTRES)[cluster] + SPREAD * rng.normal(size=(n, D)), -BOX, BOX)
    return X, (cluster > 0).astype(int), np.repeat(np.arange(CLIENTS), ROWS)


def with_canary(data: Data) -> Data:
    """``data`` with the canary (and its label) appended to client 0."""
    X, y, groups = data
    return np.vstack([X, CANARY]), np.r_[y, CANARY_LABEL], np.r_[groups, 0]


def make_detector(mode: str):
    """The unfitted detector of ``mode`` (one of :data:`MODES`)."""
    private = {"epsilon": EPSILON, "delta": DELTA, "bounds": ([-BOX] * D, [BOX] * D)}
    if mode == "none":
        return FedGMMDetector(**FEDGMM)
    if mode in ("central", "local", "distributed"):
        return FedGMMDetector(**FEDGMM, privacy=Privacy(**private, mode=mode))
    if mode == "joint-dpsgd":
        privacy = Privacy(**private, sample_rate=JOINT_SAMPLE_RATE)
        return JointFedGMMDetector(**with_options(JOINT), privacy=privacy)
    raise ValueError(f"unknown mode {mode!r}; one of {list(MODES)}.")


def canary_statistic(detector) -> float:
    """The attack's statistic of a fitted model: ``log p(canary)`` (joint model:
    ``log p(canary, CANARY_LABEL)`` with the global weights)."""
    point = np.asarray([CANARY], dtype=float)
    if isinstance(detector, JointFedGMMDetector):
        return float(detector.log_pxy(point, [CANARY_LABEL])[0])
    return float(detector.score_samples(point)[0])


def released_digest(detector) -> str:
    """A short hash of the released model (weights, means, covariances; learners), rounded
    to 10 significant digits: equal digests are the same model."""
    arrays = [detector.weights_, detector.means_, detector.covariances_]
    state = getattr(detector, "joint_state_", None)
    if state is not None:
        arrays += [t.detach().cpu().numpy() for m in state.learners for t in m.values()]
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(b"|")
        digest.update(" ".join(f"{v:.9e}" for v in np.ravel(array)).encode())
    return digest.hexdigest()[:16]


def fit_once(mode: str, member: bool, data: Data) -> dict:
    """Fit ``mode``'s detector on ``data`` (with the canary when ``member``); the record's
    figures: statistic, digest, epsilon spent, seconds."""
    X, y, groups = with_canary(data) if member else data
    start = time.perf_counter()
    detector = make_detector(mode)
    if isinstance(detector, JointFedGMMDetector):
        detector.fit(X, y, groups)
    else:
        detector.fit(X, groups=groups)
    statistic = canary_statistic(detector)
    seconds = time.perf_counter() - start
    spent = getattr(detector, "privacy_spent_", None) or {}
    return {
        "stat": statistic,
        "digest": released_digest(detector),
        "epsilon_spent": spent.get("epsilon"),
        "seconds": seconds,
    }


# --------------------------------------------------------------------------- checkpoints
def code_fingerprint() -> str:
    """12 hex digits hashing the loaded ``fednovelty`` package's source: checkpoints are
    resumed only on the same code."""
    digest = hashlib.sha256()
    root = Path(fednovelty.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def settings_fingerprint(mode: str) -> str:
    """12 hex digits hashing :data:`SETTINGS` and every parameter of ``mode``'s detector:
    a checkpointed fit of ``mode`` counts only under the same."""
    params = sorted(make_detector(mode).get_params().items())
    text = json.dumps([SETTINGS, params], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def record_key(record: dict) -> tuple[str, str, bool, int]:
    """A fit's key: ``(mode, role, member, index)``."""
    return record["mode"], record["role"], bool(record["member"]), int(record["index"])


def load_records(path: Path) -> dict[tuple, dict]:
    """The finished fits in ``path`` by :func:`record_key` (none when it is missing); a
    line cut short by an interrupted write, an unknown mode or other settings
    (:func:`settings_fingerprint`) are skipped."""
    records, fingerprints = {}, {mode: settings_fingerprint(mode) for mode in MODES}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("settings") == fingerprints.get(record.get("mode")):
                records[record_key(record)] = record
    return records


def planned_fits(mode: str, trials: int, shadows: int) -> list[tuple[str, str, bool, int]]:
    """The keys of ``mode``'s fits in run order: shadows first (the scores need them), then
    trials alternating member and non-member."""
    keys = [(mode, "shadow", m, i) for i in range(shadows) for m in (True, False)]
    return keys + [(mode, "trial", m, i) for i in range(trials) for m in (True, False)]


def run_fits(keys: Iterable[tuple[str, str, bool, int]], done: dict, path: Path, data: Data) -> int:
    """Run every fit of ``keys`` not in ``done``, appending each record to ``path`` as it
    finishes (and to ``done``); returns how many ran."""
    ran, fingerprints = 0, {}
    path.parent.mkdir(parents=True, exist_ok=True)
    for key in keys:
        if key in done:
            continue
        mode, role, member, index = key
        if mode not in fingerprints:
            fingerprints[mode] = settings_fingerprint(mode)
        record = {"mode": mode, "role": role, "member": member, "index": index}
        record["settings"] = fingerprints[mode]
        record.update(fit_once(mode, member, data))
        with path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        done[key] = record
        ran += 1
    return ran


# --------------------------------------------------------------------------- the attack
def lira_scores(stats: np.ndarray, shadow_in: np.ndarray, shadow_out: np.ndarray) -> np.ndarray:
    """Fixed-variance online LiRA scores (n,) of statistics ``stats`` (n,): the Gaussian log
    likelihood ratio ``(m1 - m0) (s - (m0 + m1) / 2) / sd^2`` with ``m1``, ``m0`` the means of
    the shadow statistics with and without the canary (each (S,)) and ``sd`` their pooled
    spread (floored at ``1e-9`` of the statistics' scale)."""
    m1, m0 = float(np.mean(shadow_in)), float(np.mean(shadow_out))
    variances = [np.var(s, ddof=1) for s in (shadow_in, shadow_out) if np.size(s) > 1]
    sd = math.sqrt(float(np.mean(variances))) if variances else 0.0
    sd = max(sd, 1e-9 * max(1.0, abs(m0), abs(m1)))
    return (m1 - m0) * (np.asarray(stats, float) - (m0 + m1) / 2) / sd**2


def held_out_bound(members: np.ndarray, nonmembers: np.ndarray) -> EpsilonLowerBound | None:
    """The valid 95 % bound: threshold and direction from the even-numbered trials, the
    Clopper-Pearson bound on the odd-numbered ones (``None`` below 2 trials a side)."""
    if min(members.size, nonmembers.size) < 2:
        return None
    chosen = epsilon_lower_bound(members[::2], nonmembers[::2], DELTA, LEVEL)
    return epsilon_lower_bound(
        members[1::2], nonmembers[1::2], DELTA, LEVEL, chosen.threshold, chosen.flipped
    )


def claimed_epsilon(mode: str) -> float:
    """The budget ``mode``'s fits claim (``inf`` without DP)."""
    return math.inf if mode == "none" else EPSILON


def summarize(mode: str, records: dict, trials: int, shadows: int) -> dict:
    """One table row's figures from ``mode``'s finished fits."""

    def stats(role: str, member: bool, count: int) -> np.ndarray:
        rows = [records[(mode, role, member, i)] for i in range(count)]
        return np.array([r["stat"] for r in rows])

    def distinct(member: bool) -> int:
        return len({records[(mode, "trial", member, i)]["digest"] for i in range(trials)})

    scores = {
        m: lira_scores(
            stats("trial", m, trials),
            stats("shadow", True, shadows),
            stats("shadow", False, shadows),
        )
        for m in (True, False)
    }
    auc = auc_interval(scores[True], scores[False], n_boot=N_BOOT, level=LEVEL)
    eps = claimed_epsilon(mode)
    mine = [r for k, r in records.items() if k[0] == mode]
    spent = [r["epsilon_spent"] for r in mine if r.get("epsilon_spent") is not None]
    return {
        "mode": mode,
        "claimed": eps,
        "spent": max(spent) if spent else None,
        "auc": auc,
        "dp_bound": dp_auc_bound(eps, DELTA),
        "gdp_bound": gdp_auc_bound(gdp_mu_for_epsilon(eps, DELTA)),
        "held_out": held_out_bound(scores[True], scores[False]),
        "best": epsilon_lower_bound(scores[True], scores[False], DELTA, LEVEL),
        "distinct": (distinct(False), distinct(True)),
        "trials": trials,
        "seconds": sum(r["seconds"] for r in mine),
    }


# --------------------------------------------------------------------------- the report
def _eps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def _bound(found: EpsilonLowerBound | None) -> str:
    if found is None:
        return "n/a"
    return (
        f"{found.epsilon:.2f} (FP {found.false_positives}/{found.n_nonmembers}, "
        f"FN {found.false_negatives}/{found.n_members})"
    )


def table(rows: list[dict]) -> str:
    """The markdown table of :func:`summarize`'s rows."""
    lines = [
        "| mode | claimed eps (spent) | attack AUC [95% CI] | AUC bound (eps,delta) / GDP "
        "| emp. eps LB [95% CP, held-out threshold] | emp. eps LB [95% CP, best threshold] "
        "| distinct models (out / in) | trials | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        auc, low, high = row["auc"]
        spent = "" if row["spent"] is None else f" ({row['spent']:.3f})"
        out, into = row["distinct"]
        lines.append(
            f"| {row['mode']} | {_eps(row['claimed'])}{spent} | {auc:.3f} [{low:.3f}, {high:.3f}] "
            f"| {row['dp_bound']:.3f} / {row['gdp_bound']:.3f} | {_bound(row['held_out'])} "
            f"| {_bound(row['best'])} | {out} / {into} | {row['trials']} | {row['seconds']:.0f} |"
        )
    return "\n".join(lines)


def notes(rows: list[dict]) -> list[str]:
    """What a reader should not miss: private modes whose fits released one model."""
    lines = []
    for row in rows:
        if not math.isinf(row["claimed"]) and row["trials"] > 1 and row["distinct"] == (1, 1):
            lines.append(
                f"- {row['mode']}: all {row['trials']} non-member fits released the same model, "
                "and all member fits another: the noise is a function of the rows and "
                "random_state, so an adversary who knows the seed reruns the fit and names "
                "the member every time."
            )
    return lines


def _git(*args: str) -> str:
    """A git command's output in this checkout ("" when git fails)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _blob_id(path: Path) -> str:
    """git's object id of a file's content."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def code_facts() -> str:
    """One line: this checkout's commit, where ``fednovelty`` was loaded from, and whether
    its source files are that commit's (git object ids compared), and the cores."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    package = Path(fednovelty.__file__).resolve().parent
    committed = {}
    for line in _git("ls-tree", "-r", "HEAD", "--", "fednovelty").splitlines():
        meta, name = line.split("\t", 1)
        if name.endswith(".py"):
            committed[name] = meta.split()[2]
    loaded = {f"fednovelty/{p.relative_to(package)}": _blob_id(p) for p in package.rglob("*.py")}
    differ = sum(committed.get(name) != blob for name, blob in loaded.items())
    differ += len(committed.keys() - loaded.keys())
    same = "all its .py files are" if differ == 0 else f"{differ} of its .py files differ from"
    where = "this checkout" if package == REPO / "fednovelty" else str(package)
    return f"fednovelty from {where}: {same} commit {commit}'s; cores {os.cpu_count()}"


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="fits per side")
    parser.add_argument("--shadows", type=int, default=DEFAULT_SHADOWS, help="shadow fits per side")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    add_quick(parser, "smoke run: 2 trials and 2 shadows a side")
    add_out(parser, "the checkpoints' folder")
    parser.add_argument("--report", type=Path, default=None, help="where the table goes")
    args = parser.parse_args(argv)
    if args.quick:  # checkpoints in a scratch folder, the report only where asked
        args.trials, args.shadows = 2, 2
    else:
        args.out = args.out or HERE / "results" / "privacy_audit"
        args.report = args.report or HERE / "privacy_audit.txt"
    if args.trials < 1 or args.shadows < 1:
        parser.error("--trials and --shadows must be >= 1.")
    return args


def main(argv=None) -> str:
    """Run (or resume) every mode's fits, print the table and write the report."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    data = make_data()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) if args.out is None else args.out
        return _audit(args, argv, data, out / f"scores-{code_fingerprint()}.jsonl", start)


def _audit(args: argparse.Namespace, argv, data: Data, path: Path, start: float) -> str:
    """:func:`main`'s body once the checkpoint's ``path`` is known."""
    done = load_records(path)
    resumed = len(done)
    rows = []
    for mode in args.modes:
        ran = run_fits(planned_fits(mode, args.trials, args.shadows), done, path, data)
        rows.append(summarize(mode, done, args.trials, args.shadows))
        print(f"{mode}: {ran} fits run, {rows[-1]['seconds']:.0f} s of fits in all", flush=True)
    command = command_line("privacy_audit", argv)
    header = report_header(
        "Privacy audit of whole fits", command, args.quick, time.perf_counter() - start
    )
    body = [
        f"- {code_facts()}",
        f"- checkpoint: {_shown(path)} ({resumed} finished fits found there)",
        f"- data: {CLIENTS} clients x {ROWS} rows, d = {D}, box [-{BOX:g}, {BOX:g}]; canary "
        f"{CANARY} at client 0; random_state {SEED} in every fit; {args.shadows} shadow fits a "
        f"side; delta = {DELTA:g}",
        "",
        table(rows),
        "",
        "Attack: fixed-variance online LiRA on log p(canary) from the adversary's shadow fits "
        "(same rows, same random_state). AUC bounds: any (eps, delta)-DP mechanism / the "
        "Gaussian mechanism of that budget. Empirical epsilon lower bounds: 95 % "
        "Clopper-Pearson; held-out = threshold chosen on even trials, counted on odd ones "
        "(a valid bound); best = best threshold over all trials (optimistic).",
        *notes(rows),
    ]
    return emit_report(header + "\n" + "\n".join(body) + "\n", args.report)


if __name__ == "__main__":
    main()
