"""``FedEnsembleDetector``: an ensemble of one-round FedGenGMM fits on feature subsets.

Each of ``n_members`` members is FedGenGMM's one round: member 0 on every column, the
others on random subsets of the columns (:mod:`fednovelty.federated.mixtures.ensemble`: the
subsets are public plan drawn from ``random_state``, widths from ``feature_fraction``).
With ``combine="zscore"`` one more round gives the pooled training rows' mean and standard
deviation of each member's score ``-log p_m(x_S_m)``, and ``decision_function`` is the
mean over members of the standardised scores; with ``combine="mean"`` it is the plain mean
of the members' scores and no extra round runs. ``score_samples`` is minus
``decision_function`` (higher = more normal): a combination of log-densities, not the
log-density of one model, so the per-component API (``responsibilities``, ``explain``,
``sample``, ...) is refused by name.

Cost: ``n_members`` rounds of FedGenGMM's message (one local mixture on the member's
columns up), plus the moments round (every member's global mixture down, 2 numbers a
member and the row count up).
"""

from __future__ import annotations

from numbers import Integral
from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._declare import Param
from fednovelty.detectors._option_fields import FLOOR, REMEDIES
from fednovelty.detectors._params import declare, option, store
from fednovelty.detectors.fedgengmm import (
    FEDGEN_DOCS,
    FEDGEN_PRIOR_DOCS,
    LOCAL_PRIVACY_DOCS,
    LOCAL_SAMPLING,
    FedGenGMMDetector,
)
from fednovelty.detectors.options import Prior, Privacy
from fednovelty.detectors.persistence import check_items, get_attr
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.mixtures.ensemble import (
    COMBINE_CHOICES,
    FedEnsemble,
    check_fraction,
    ensemble_scores,
    member_scores,
)


def _fraction_pair(value, n_features: int) -> tuple[float, float]:
    """``feature_fraction`` as the algorithm takes it (checked: ``check_fraction``)."""
    return check_fraction(value)


class FedEnsembleDetector(FedGenGMMDetector):
    """An ensemble of one-round FedGenGMM fits on random feature subsets (module docstring).

    Attributes:
        members_: each member's global mixture (``MixtureParams``) on its columns.
        subsets_: each member's columns (lists of column indices).
        score_mean_, score_std_: (n_members,) the pooled training rows' mean and standard
            deviation of each member's score (``combine="zscore"``), else ``None``.
        skipped_clients_: clients that skipped some round (below their floor).
        history_, n_rounds_, bytes_up_, bytes_down_: the rounds and their bytes.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.
    """

    _algorithm: type = FedEnsemble
    _pca_front_end = False
    _renamed_params: ClassVar[dict] = {}
    _params = declare(
        Param(
            "n_components",
            10,
            [Interval(Integral, 1, None, closed="left"), None],
            "number of components of each member's global mixture; ``None`` chooses it by "
            "BIC over ``k_range``.",
        ),
        Param(
            "samples_per_component",
            100,
            [Interval(Integral, 1, None, closed="left")],
            "synthetic rows each member's server fit draws per client component.",
        ),
        Param(
            "n_members",
            4,
            [Interval(Integral, 1, None, closed="left")],
            "members of the ensemble: one FedGenGMM round each (member 0 on every column).",
        ),
        Param(
            "feature_fraction",
            (0.5, 1.0),
            ["array-like"],
            "``(lo, hi)``, ``0 < lo <= hi <= 1``: each member after the first sees from "
            "``ceil(lo * d)`` to below ``hi * d`` of the ``d`` columns (``(1, 1)``: all).",
            convert=_fraction_pair,
        ),
        Param(
            "combine",
            "zscore",
            [StrOptions(set(COMBINE_CHOICES))],
            "``\"zscore\"``: members' scores standardised by the pooled training scores' "
            'mean and standard deviation (one more round), then averaged; ``"mean"``: '
            "averaged as they are.",
        ),
        option(Prior, fields=REMEDIES, docs=FEDGEN_PRIOR_DOCS),
        LOCAL_SAMPLING,
        option(Privacy, fields=FLOOR, docs=LOCAL_PRIVACY_DOCS),
        docs=FEDGEN_DOCS,
    )

    def __init__(
        self,
        n_components=10,
        client_components=None,
        k_range=(1, 10),
        *,
        n_members=4,
        feature_fraction=(0.5, 1.0),
        combine="zscore",
        min_client_samples=2,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        samples_per_component=100,
        prior=None,
        sampling=None,
        robustness=None,
        privacy=None,
        contamination=0.1,
        calibration="contamination",
        alpha=0.01,
        calibration_share=0.2,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ) -> None:
        store(self, locals())

    def max_fit_rounds(self, n_features: int | None = None) -> int:
        """``n_members`` rounds, and the moments round with ``combine="zscore"``."""
        return int(self.n_members) + (self.combine == "zscore")

    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        n_total = sum(p.shape[0] for p in parts)
        if self.n_components is not None and self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        width = int(clients[0].shape[1])
        algorithm = FedEnsemble(
            **self._settings(width),
            n_features=width,
            random_state=seed,
            **self._torch_options(),
        )
        self._check_some_client_fits(algorithm, clients)
        result = self._simulate(algorithm, clients, seed, full=True)
        state = result.state
        options = self._torch_options()
        self.members_ = [member.params.to(**options) for member in state.members]
        self.subsets_ = [list(columns) for columns in algorithm.subsets()]
        zscore = state.score_mean is not None
        self.score_mean_ = state.score_mean.numpy() if zscore else None
        self.score_std_ = state.score_std.numpy() if zscore else None
        ids = self.client_ids_.tolist()
        skipped = sorted({c for record in result.history for c, _ in record.skipped})
        self.skipped_clients_ = [ids[c] for c in skipped]
        self.client_n_components_ = {
            ids[c]: m.n_components for c, m in state.members[0].client_models.items()
        }
        self.n_synthetic_ = sum(member.n_synthetic for member in state.members)
        self.bic_ = {}
        self.n_components_ = self.members_[0].n_components
        self.copula_marginals_, self.copula_joint_ = None, None

    def _validate_params(self) -> None:
        super()._validate_params()
        check_fraction(self.feature_fraction)

    def member_scores(self, X) -> np.ndarray:
        """Each member's anomaly score ``-log p_m(x_S_m)``, shape (n_members, n_samples)."""
        Xt = self._check_score_input(X)
        with torch.no_grad():
            return member_scores(self.members_, self.subsets_, Xt).cpu().numpy()

    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        """Minus the ensemble's anomaly score (module docstring), shape (n_samples,)."""
        scores = member_scores(self.members_, self.subsets_, X)
        if self.score_mean_ is None:
            return -ensemble_scores(scores, "mean")
        mean, std = torch.as_tensor(self.score_mean_), torch.as_tensor(self.score_std_)
        return -ensemble_scores(scores, "zscore", mean, std)

    def _log_density_bound(self) -> None:
        return None

    def _components(self):
        raise TypeError(
            "FedEnsembleDetector is an ensemble of mixtures on different feature subsets: it "
            "has no one set of components (responsibilities, explain, ...). Read members_ "
            "and subsets_, or use FedGenGMMDetector."
        )

    def _refuse_components(self, client) -> None:
        """An unseen ``client`` named first (``_client_index``), then ``_components``'s
        refusal."""
        if client is not None:
            self._client_index(client)
        self._components()

    def component_weights(self, *, client=None):
        """Refused (``_components``): the members' Gaussians are on different columns."""
        self._refuse_components(client)

    def component_log_densities(self, X):
        """Refused (``_components``)."""
        self._refuse_components(None)

    def responsibilities(self, X, *, client=None):
        """Refused (``_components``)."""
        self._refuse_components(client)

    def predict_components(self, X, *, client=None):
        """Refused (``_components``)."""
        self._refuse_components(client)

    def explain(self, X, *, client=None):
        """Refused (``_components``)."""
        self._refuse_components(client)

    def _n_parameters(self) -> int:
        raise NotImplementedError(
            "bic and aic are not defined here: FedEnsembleDetector's score is an ensemble "
            "of standardised member scores, not one mixture's likelihood."
        )

    def sample(self, n_samples=1, random_state=None):
        """Refused: the ensemble's score is not the density of one mixture it holds."""
        raise NotImplementedError(
            "sample is not defined here: FedEnsembleDetector's score is an ensemble of "
            "mixtures on different feature subsets, not one density to draw from."
        )

    def _set_result(self, result) -> None:
        raise TypeError(
            "FedEnsembleDetector.from_model is not supported; fit FedEnsembleDetector with "
            "groups instead."
        )

    # ------------------------------------------------------------------ persistence
    def _get_state(self):
        tensors = {}
        for m, params in enumerate(self.members_):
            tensors.update(self._mixture_tensors(params, f"member.{m}"))
        attrs = {
            "subsets_": self.subsets_,
            "score_mean_": None if self.score_mean_ is None else self.score_mean_.tolist(),
            "score_std_": None if self.score_std_ is None else self.score_std_.tolist(),
            "skipped_clients_": self.skipped_clients_,
            "client_n_components_": [[k, v] for k, v in self.client_n_components_.items()],
            "n_synthetic_": self.n_synthetic_,
        }
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super(FedGenGMMDetector, self)._set_state(tensors, attrs)
        subsets = get_attr(attrs, "subsets_", list)
        width = self.n_features_in_
        for m, columns in enumerate(subsets):
            check_items(columns, f"subsets_[{m}]", int)
            if (
                not columns
                or len(set(columns)) != len(columns)
                or not all(0 <= j < width for j in columns)
            ):
                raise ModelFormatError(
                    f"subsets_[{m}] = {columns!r}: needs distinct column indices in [0, {width})."
                )
        self.subsets_ = [list(columns) for columns in subsets]
        self.members_ = [
            self._mixture_from(tensors, f"member.{m}", self.covariance_type, len(columns))
            for m, columns in enumerate(self.subsets_)
        ]
        self.score_mean_ = self._saved_moments(attrs, "score_mean_")
        self.score_std_ = self._saved_moments(attrs, "score_std_")
        if (self.score_mean_ is None) != (self.score_std_ is None) or (
            self.score_std_ is not None and not bool((self.score_std_ > 0).all())
        ):
            raise ModelFormatError(
                "score_mean_ and score_std_ must both be lists of one number a member "
                "(standard deviations > 0), or both null."
            )
        self.n_synthetic_ = get_attr(attrs, "n_synthetic_", int, minimum=0)
        self.n_components_ = self.members_[0].n_components
        self.bic_, self.copula_marginals_, self.copula_joint_ = {}, None, None
        self._set_client_record(attrs)

    def _saved_moments(self, attrs: dict, name: str) -> np.ndarray | None:
        value = attrs.get(name)
        if value is None:
            return None
        check_items(get_attr(attrs, name, list), name, (int, float))
        array = np.asarray(value, dtype=np.float64)
        if array.shape != (len(self.subsets_),) or not np.isfinite(array).all():
            raise ModelFormatError(f"{name} must hold one finite number a member.")
        return array
