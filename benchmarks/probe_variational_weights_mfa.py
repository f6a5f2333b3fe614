"""Probe: variational weights alone on a mixture of factor analysers (point loadings)."""
import torch, numpy as np
from fednovelty.mixture.factor import fit_mfa, WeightPrior
rng = np.random.default_rng(0)
W = rng.normal(size=(8, 2))
X = np.vstack([rng.normal(size=(300, 2)) @ W.T + 0.3 * rng.normal(size=(300, 8)),
               rng.normal(size=(300, 2)) @ W.T + 0.3 * rng.normal(size=(300, 8)) + 8])
X = torch.tensor(X)
for wp in [None, WeightPrior(1 / 6), WeightPrior(1 / 6, "dirichlet_distribution"), WeightPrior(1e-3)]:
    r = fit_mfa(X, 6, 2, generator=torch.Generator().manual_seed(0), weight_prior=wp, max_iter=200)
    print(wp, r.params.weights.numpy().round(3), r.n_iter)
