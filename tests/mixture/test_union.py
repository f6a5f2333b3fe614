"""union and split (fednovelty.mixture.containers): the union's density is the shares'
mean of the members' densities, checked against scikit-learn's GaussianMixture and
scipy's multivariate normal; split takes the members back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.mixture import GaussianMixture

from fednovelty.mixture import MixtureParams, score_samples
from fednovelty.mixture.containers import split, union
from fednovelty.mixture.factor import FactorParams, factor_score_samples


def _sklearn_members(covariance_type: str):
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (200, 3)), rng.normal(4, 0.5, (200, 3))])
    fits = [
        GaussianMixture(k, covariance_type=covariance_type, random_state=s).fit(X)
        for k, s in ((2, 0), (3, 1), (1, 2))
    ]
    params = [
        MixtureParams(
            torch.tensor(g.weights_),
            torch.tensor(g.means_),
            torch.tensor(g.precisions_cholesky_),
            covariance_type,
        )
        for g in fits
    ]
    return X, fits, params


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_union_density_is_the_shares_mean_of_the_members_densities(covariance_type):
    X, fits, params = _sklearn_members(covariance_type)
    shares = np.array([0.5, 0.3, 0.2])
    joined = union(params, torch.tensor(shares))
    expected = logsumexp(np.stack([g.score_samples(X) for g in fits]) + np.log(shares)[:, None], 0)
    got = score_samples(joined, torch.tensor(X)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    assert joined.n_components == 6 and float(joined.weights.sum()) == pytest.approx(1.0)


def test_default_shares_are_uniform_and_split_gives_the_members_back():
    X, fits, params = _sklearn_members("full")
    joined = union(params)
    expected = logsumexp(np.stack([g.score_samples(X) for g in fits]), 0) - np.log(3)
    np.testing.assert_allclose(score_samples(joined, torch.tensor(X)).numpy(), expected, rtol=1e-9)
    back = split(joined, [2, 3, 1])
    for member, fit in zip(back, fits, strict=True):
        np.testing.assert_allclose(
            score_samples(member, torch.tensor(X)).numpy(), fit.score_samples(X), rtol=1e-9
        )


def test_factor_params_union_scores_as_the_mean_of_gaussian_densities():
    rng = np.random.default_rng(1)
    members = []
    for k in (2, 1):
        members.append(
            FactorParams(
                torch.full((k,), 1.0 / k, dtype=torch.float64),
                torch.tensor(rng.normal(size=(k, 4))),
                torch.tensor(rng.normal(size=(k, 4, 2))),
                torch.tensor(rng.uniform(0.5, 1.5, size=(k, 4))),
            )
        )
    X = rng.normal(size=(50, 4))

    def density(m: FactorParams) -> np.ndarray:  # scipy's normal on W W^T + diag(psi)
        cov = m.factors.numpy() @ m.factors.numpy().transpose(0, 2, 1)
        cov = cov + np.stack([np.diag(p) for p in m.psi.numpy()])
        return sum(
            w * multivariate_normal(mu, c).pdf(X)
            for w, mu, c in zip(m.weights.numpy(), m.means.numpy(), cov, strict=True)
        )

    expected = np.log((density(members[0]) + density(members[1])) / 2)
    got = factor_score_samples(torch.tensor(X), union(members)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_union_refuses_what_it_cannot_join_by_name():
    _, _, params = _sklearn_members("full")
    with pytest.raises(ValueError, match="at least one"):
        union([])
    with pytest.raises(ValueError, match="shares must be 3"):
        union(params, torch.tensor([0.5, 0.5, 0.5]))
    tied = MixtureParams(
        torch.tensor([0.5, 0.5], dtype=torch.float64),
        torch.zeros(2, 3, dtype=torch.float64),
        torch.eye(3, dtype=torch.float64),
        "tied",
    )
    with pytest.raises(ValueError, match="tied covariance is shared"):
        union([tied, tied])
    diag = _sklearn_members("diag")[2][0]
    with pytest.raises(ValueError, match="one covariance_type"):
        union([params[0], diag])
    with pytest.raises(ValueError, match="summing to the mixture's 6 components"):
        split(union(params), [2, 3])
