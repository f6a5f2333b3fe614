"""In-process secure rounds decide nothing from the data or a known seed: the public bound on
a client's rows is the caller's (``SecureSum.max_rows``, required), the stochastic rounding
comes from fresh OS entropy unless a test names ``insecure_seed``, and a distributed-DP run
without a secure sum says, by a named warning, that the server sees each client's reply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from fednovelty.detectors.options import Privacy
from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.runtime import run_simulation
from fednovelty.runtime.secure_rounds import SecureSum, clip_ranges

M, Z, CLIP, SEED = 4, 3.0, 3.0, 3
BOUNDS = [[-6.0] * 3, [8.0] * 3]


def _clients(sizes=(200, 250, 300, 350)) -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    return [torch.as_tensor(rng.normal(i, 1.0, (n, 3))) for i, n in enumerate(sizes)]


def _algorithm() -> FederatedEM:
    return FederatedEM(
        2,
        bounds=BOUNDS,
        standardize=True,  # a moments round first
        dp_mode="distributed",
        dp_noise_multiplier=Z,
        dp_clip=CLIP,
        max_iter=1,
        kmeans_rounds=1,
        random_state=0,
    )


def _policy() -> PrivacyPolicy:
    return PrivacyPolicy(dp=DPPolicy(Z, CLIP, "distributed", M, insecure_seed=SEED))


def _run(secure, clients=None):
    records = []
    result = run_simulation(
        _algorithm(),
        _clients() if clients is None else clients,
        privacy=_policy(),
        secure_sum=secure,
        callbacks=[records.append],
    )
    return result, records


# ----------------------------------------------------------------- the public row bound
def test_the_row_bound_is_the_callers_never_the_largest_clients():
    for secure in (SecureSum(), True):
        with pytest.raises(ValueError, match="max_rows"):
            _run(secure)
    expected = clip_ranges("moments", 1, max_rows=1000, bound=CLIP, noise_multiplier=Z,
                           margin=10.0)  # fmt: skip
    for sizes in ((200, 250, 300, 350), (200, 250, 300, 900)):
        _, records = _run(SecureSum(max_rows=1000), _clients(sizes))
        assert records[0].kind == "moments"
        for name, clip in expected.items():
            assert records[0].metrics[f"secure_clip_{name}"] == pytest.approx(clip, rel=1e-15)


# ----------------------------------------------------------------- rounding
def test_the_rounding_is_fresh_unless_a_test_names_an_insecure_seed():
    """At 16 bits the stochastic rounding moves the mixture visibly: two runs with the same
    settings (the same DP noise, by the policy's test seed) differ, as the server, which
    knows every setting and ``random_state``, cannot re-draw the rounding."""
    coarse = SecureSum(bits=16, max_rows=400)
    first, _ = _run(coarse)
    second, _ = _run(coarse)
    assert not torch.equal(first.state.params.means, second.state.params.means)


def test_an_insecure_seed_reproduces_the_rounding():
    seeded = SecureSum(bits=16, max_rows=400, insecure_seed=5)
    first, _ = _run(seeded)
    second, _ = _run(seeded)
    assert torch.equal(first.state.params.means, second.state.params.means)


# ----------------------------------------------------------------- distributed mode
def test_distributed_dp_without_a_secure_sum_warns_by_name():
    with pytest.warns(UserWarning, match=r"z / sqrt\(m\)") as caught:
        _run(None)
    names = {type(w.message).__name__ for w in caught}
    assert "UnsummedDistributedWarning" in names


def test_a_detectors_distributed_fit_warns_and_reports_the_servers_epsilon():
    """The detectors fit in process without a secure sum: the fit says so, and its
    ``privacy_spent_`` puts the guarantee against the server at the replies' own noise
    (``z / sqrt(m)``), above the budget (2.15 for epsilon 1 and four clients here)."""
    from fednovelty.detectors import FedGMMDetector

    rng = np.random.default_rng(0)
    X, groups = rng.normal(0, 1, (1200, 3)), np.repeat(np.arange(4), 300)
    detector = FedGMMDetector(
        n_components=2,
        mixture_weights="global",
        max_iter=3,
        random_state=0,
        privacy=Privacy(epsilon=1.0, mode="distributed", bounds=([-5.0] * 3, [5.0] * 3)),
    )
    with pytest.warns(UserWarning) as caught:
        detector.fit(X, groups=groups)
    assert "UnsummedDistributedWarning" in {type(w.message).__name__ for w in caught}
    spent = detector.privacy_spent_
    assert spent["epsilon"] <= 1.0 + 1e-9 < 1.5 < spent["epsilon_against_server"]
