"""Membership inference against the differentially private paths: privacy tested, not assumed.

Through the real client gate (``FederatedEM.answer`` under a local ``DPPolicy``): the noise on
what leaves the client has the calibrated spread, and the likelihood-ratio attack of an
adversary who knows every row but the target reaches, and does not exceed, the Gaussian-DP
bound of the release. On the DP-trained detector: the loss attack that separates a
non-private overfit detector's members from held-out rows does not separate them at
epsilon = 1.

References are independent of the code under test: the block split and sensitivities
written out here, the statistics about the origin summed in numpy from the rows clipped by
hand, SciPy's chi-square and normal, and the Hanley-McNeil standard error written out."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2, norm

from fednovelty.detectors import FedGMMDetector
from fednovelty.detectors.options import Initialisation, Prior, Privacy
from fednovelty.evaluation.membership import gate_attack, score_attack
from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise, epsilon_spent

D = 2
BOX = 4.0
CLIP = 1.5 * math.sqrt(D)
#: the budget split of one release, by hand: counts, first moments, second moments.
SPLIT = {"counts": 8.0, "sums": 2.5, "second": 1 / math.sqrt(3 - 1 / 64 - 1 / 6.25)}
SENSITIVITY = {"counts": 1.0, "sums": CLIP, "second": CLIP**2}
ROWS = np.random.default_rng(0).normal(size=(29, D))
#: beyond the clipping ball along a feature axis (16 / BOX = 4 > CLIP box units): adding it
#: moves every block by its full sensitivity.
CANARY = np.array([16.0, 0.0])


def _standard_error(auc, n_pos, n_neg):
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)
    return math.sqrt(var / (n_pos * n_neg))


def _algorithm(z, mean=(0.0, 0.0), mode="local"):
    """One-component federated EM under DP, its ``em`` broadcast (after ``start``)."""
    algorithm = FederatedEM(
        1,
        dp_mode=mode,
        dp_noise_multiplier=z,
        dp_clip=CLIP,
        bounds=([-BOX] * D, [BOX] * D),
        weights_init=np.array([1.0]),
        means_init=np.array([mean]),
        precisions_init=np.eye(D)[None],
        max_iter=1,
    )
    state = algorithm.start()
    assert state.phase == "em"
    return algorithm, algorithm.configure(state)


def _origin_stats(rows):
    """counts, sums and the second moments' upper triangle about the origin of the box
    units, of rows scaled into the box and clipped to the ball, by hand."""
    u = np.asarray(rows, float) / BOX
    norms = np.linalg.norm(u, axis=1, keepdims=True)
    u = np.where(norms > CLIP, u * CLIP / norms, u)
    outer = np.einsum("ni,nj->ij", u, u)[np.triu_indices(D)]
    return {"counts": np.array([len(u)]), "sums": u.sum(0), "second": outer}


def test_gate_noise_has_the_calibrated_spread():
    z, n = 3.0, 400
    algorithm, message = _algorithm(z, mean=(2.0, -1.0))
    shift = message.tensors["shift"].numpy()
    assert np.abs(shift).max() > 0.1  # the reply is about a shift the test undoes by hand
    exact = _origin_stats(ROWS)
    residual = {name: [] for name in SPLIT}
    for trial in range(n):
        policy = PrivacyPolicy(min_rows=1, dp=DPPolicy(z, CLIP, "local", insecure_seed=trial))
        reply = gate.answer(
            algorithm, torch.as_tensor(ROWS), message, gate.client_context(7, policy=policy)
        )
        c = reply.tensors["counts"].numpy()[0]
        s = reply.tensors["sums"].numpy()[0]
        S = reply.tensors["second"].numpy()[0]
        assert np.allclose(S, S.T)  # symmetric noise
        sums = s + c * shift  # about the origin, with the released (noisy) count
        second = S + np.outer(s, shift) + np.outer(shift, s) + c * np.outer(shift, shift)
        released = {"counts": [c], "sums": sums, "second": second[np.triu_indices(D)]}
        for name in SPLIT:
            residual[name].append(np.asarray(released[name]) - exact[name])
    for name, values in residual.items():
        values = np.array(values)
        sigma = z * SPLIT[name] * SENSITIVITY[name]
        dof = values.size
        statistic = float((values**2).sum()) / sigma**2
        assert chi2.ppf(1e-4, dof) < statistic < chi2.ppf(1 - 1e-4, dof), name
        # centred: the mean residual is within 4.5 standard errors of 0
        assert np.abs(values.mean(0)).max() < 4.5 * sigma / math.sqrt(n), name


def test_one_release_at_epsilon_one_stays_within_the_gdp_bound():
    z = calibrate_noise(1.0, 1e-5, 1, 3)
    algorithm, message = _algorithm(z)
    policy = PrivacyPolicy(min_rows=1, dp=DPPolicy(z, CLIP, "local"))
    n_trials = 2000
    result = gate_attack(algorithm, message, policy, ROWS, CANARY, n_trials=n_trials, seed=1)
    mu = math.sqrt(3) / z
    bound = norm.cdf(mu / math.sqrt(2))
    margin = 3 * _standard_error(bound, n_trials // 2, n_trials // 2)
    assert result.signal == pytest.approx(mu, rel=1e-9)  # the canary moves every block fully
    assert result.auc <= bound + margin
    assert result.auc >= bound - margin  # the attack is the optimal one: it reaches the bound
    # the released noise of every block has the calibrated spread
    for name, values in result.noise.items():
        assert result.sigma[name] == pytest.approx(z * SPLIT[name] * SENSITIVITY[name])
        ratio = values.std() / result.sigma[name]
        assert abs(ratio - 1) < 4 / math.sqrt(2 * values.size)
    # the product target 0.55: the worst case of one release at epsilon = 1 is above it
    assert bound > 0.55


def test_budget_and_trust_model_of_the_gate():
    z = 2.0
    algorithm, message = _algorithm(z)
    # a client whose budget is one release refuses the second
    one = epsilon_spent(z, 1, 1e-5)
    policy = PrivacyPolicy(min_rows=1, dp=DPPolicy(z, CLIP, "local", epsilon=one, delta=1e-5))
    with pytest.raises(ValueError, match="budget is spent"):
        gate_attack(algorithm, message, policy, ROWS, CANARY, n_trials=2, releases=2)
    # central mode: the client trusts the server, so what leaves it carries no noise
    central, broadcast = _algorithm(z, mode="central")
    policy = PrivacyPolicy(min_rows=1, dp=DPPolicy(z, CLIP, "central"))
    exposed = gate_attack(central, broadcast, policy, ROWS, CANARY, n_trials=40)
    assert exposed.auc == 1.0 and math.isinf(exposed.mu)


def _score_aucs(dp_epsilon, seeds):
    """Mean loss-attack AUC of FedGMMDetector (8 components, no prior) on 4 clients of 10
    rows of N(0, I_2) against 40 held-out rows, over ``seeds`` fresh datasets."""
    params = dict(
        n_components=8,
        prior=Prior(strength=None),
        privacy=Privacy(min_rows=1),
        max_iter=10,
        initialisation=Initialisation(kmeans_rounds=3),
    )
    if dp_epsilon is not None:
        bounds = ([-BOX] * D, [BOX] * D)
        params["privacy"] = Privacy(min_rows=1, epsilon=dp_epsilon, delta=1e-5, bounds=bounds)
    aucs, spent = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(100 + seed)
        members, held_out = rng.normal(size=(40, D)), rng.normal(size=(40, D))
        detectors = []

        def factory(seed=seed, detectors=detectors):
            detectors.append(FedGMMDetector(**params, random_state=seed))
            return detectors[-1]

        groups = {"groups": np.repeat(np.arange(4), 10)}
        aucs.append(score_attack(factory, members, held_out, fit_kwargs=groups).auc)
        spent.append(getattr(detectors[0], "privacy_spent_", {}).get("epsilon", math.inf))
    return np.array(aucs), np.array(spent)


@pytest.mark.filterwarnings("ignore")
def test_dp_detector_stops_the_loss_attack_that_beats_the_plain_one():
    seeds = 10
    plain, _ = _score_aucs(None, seeds)
    private, spent = _score_aucs(1.0, seeds)
    assert np.all(spent <= 1.0)
    margin = 3 * _standard_error(0.5, 40, 40) / math.sqrt(seeds)
    assert plain.mean() > 0.7  # the non-private detector leaks on these small clients
    assert private.mean() <= 0.55 + margin
    assert plain.mean() - private.mean() > 0.15
