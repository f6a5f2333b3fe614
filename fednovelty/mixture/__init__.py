"""Math layer: torch Gaussian-mixture kernels and summable sufficient statistics.

No federated notions live here; dtype and device come from the inputs.
"""

from fednovelty.mixture.covariance import (
    COVARIANCE_TYPES,
    covariances_from_precisions_cholesky,
    precisions_cholesky_from_covariances,
    precisions_cholesky_from_precisions,
)
from fednovelty.mixture.density import log_gaussian_prob, log_responsibilities
from fednovelty.mixture.em import (
    EMResult,
    WeightsFit,
    check_prior_rows,
    fit_em,
    fit_gmm,
    fit_gmm_bic,
    fit_gmm_scaled,
    fit_weights,
    fit_weights_map,
    kmeans_init,
    params_from_stats,
    prior_target,
)
from fednovelty.mixture.kmeans import kmeans, kmeans_plusplus
from fednovelty.mixture.model import (
    MixtureParams,
    bic,
    n_parameters,
    predict_proba,
    sample,
    score_samples,
)
from fednovelty.mixture.scaling import (
    FeatureMoments,
    affine_params,
    feature_moments,
    merge_moments,
    mixture_moments,
    standardization,
)
from fednovelty.mixture.stats import (
    CovariancePrior,
    SufficientStats,
    e_step_stats,
    m_step,
    merge_stats,
    stats_from_resp,
)

__all__ = [
    "COVARIANCE_TYPES",
    "CovariancePrior",
    "EMResult",
    "FeatureMoments",
    "MixtureParams",
    "SufficientStats",
    "WeightsFit",
    "affine_params",
    "bic",
    "check_prior_rows",
    "covariances_from_precisions_cholesky",
    "e_step_stats",
    "feature_moments",
    "fit_em",
    "fit_gmm",
    "fit_gmm_bic",
    "fit_gmm_scaled",
    "fit_weights",
    "fit_weights_map",
    "kmeans",
    "kmeans_init",
    "kmeans_plusplus",
    "log_gaussian_prob",
    "log_responsibilities",
    "m_step",
    "merge_moments",
    "merge_stats",
    "mixture_moments",
    "n_parameters",
    "params_from_stats",
    "precisions_cholesky_from_covariances",
    "precisions_cholesky_from_precisions",
    "predict_proba",
    "prior_target",
    "sample",
    "score_samples",
    "standardization",
    "stats_from_resp",
]
