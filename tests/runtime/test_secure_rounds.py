"""Secure rounds: ``run_simulation(..., secure_sum=...)`` gives the server step one combined
reply, the SecAgg sum of the clients' replies, and the run the plain run's mixture.

References are independent of the code's path: the clients' replies the plain run's server
step got, encoded and summed by hand in numpy (statistics moved about the origin, moments as
count, sum and sum of squares), against the combined reply the secure run's server step got,
within the secure sum's stated quantisation bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from fednovelty.federated import FederatedEM, Message, PrivacyPolicy
from fednovelty.federated.mixtures.fedgengmm import FedGenGMM
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.runtime import run_simulation
from fednovelty.runtime.secure_rounds import (
    COMBINED_ID,
    SecureSum,
    additive_release,
    clip_ranges,
    decode,
    encode,
    secure_round,
)

M, Z, CLIP, SEED, MAX_ROWS = 4, 3.0, 3.0, 3, 500
BOUNDS = [[-6.0] * 3, [8.0] * 3]


def recording_em(n_components: int, **settings) -> FederatedEM:
    """Federated EM that keeps a copy of the replies each server step got (its instance's
    ``server_step`` wrapped: a subclass would join the package's algorithm registry)."""
    algorithm = FederatedEM(n_components, **settings)
    algorithm.seen, algorithm.shifts = [], []
    step = algorithm.server_step

    def server_step(state, replies):
        algorithm.shifts.append(algorithm.configure(state).tensors.get("shift"))
        algorithm.seen.append(
            {
                c: Message(r.kind, {k: v.clone() for k, v in r.tensors.items()})
                for c, r in replies.items()
            }
        )
        return step(state, replies)

    algorithm.server_step = server_step
    return algorithm


def _clients(m: int = M) -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    return [torch.as_tensor(rng.normal(i, 1.0, (200 + 50 * i, 3))) for i in range(m)]


def _params(**changes) -> dict:
    params = {
        "n_components": 2,
        "bounds": BOUNDS,
        "standardize": True,  # a private moments round first
        "dp_mode": "distributed",
        "dp_noise_multiplier": Z,
        "dp_clip": CLIP,
        "max_iter": 4,
        "kmeans_rounds": 2,
        "random_state": 0,
    }
    return {**params, **changes}


def _policy(m: int = M) -> PrivacyPolicy:
    return PrivacyPolicy(dp=DPPolicy(Z, CLIP, "distributed", n_clients=m, insecure_seed=SEED))


def _run(secure, m: int = M, **changes):
    algorithm = recording_em(**_params(**changes))
    records = []
    result = run_simulation(
        algorithm, _clients(m), privacy=_policy(m), secure_sum=secure, callbacks=[records.append]
    )
    return algorithm, result, records


@pytest.fixture(scope="module")
def runs():
    return _run(None), _run(SecureSum(bits=48, max_rows=MAX_ROWS, insecure_seed=1))


# ----------------------------------------------------------------- by hand, in numpy
def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float64)


def _stats_about_origin(reply: Message, shift: np.ndarray) -> dict[str, np.ndarray]:
    """Full-covariance statistics about ``shift`` moved about the origin: rows x = v + s."""
    counts, sums, second = (_np(reply.tensors[k]) for k in ("counts", "sums", "second"))
    cross = np.einsum("ki,j->kij", sums, shift)
    return {
        "counts": counts,
        "sums": sums + counts[:, None] * shift,
        "second": second + cross + cross.transpose(0, 2, 1)
        + counts[:, None, None] * np.outer(shift, shift),
        "n_samples": _np(reply.tensors["n_samples"]),
    }  # fmt: skip


def _moments_sums(reply: Message) -> dict[str, np.ndarray]:
    n, mean, m2 = (_np(reply.tensors[k]) for k in ("n_samples", "mean", "m2"))
    return {"n_samples": n, "total": n * mean, "squares": m2 + n * mean**2}


def _summed(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.sum([p[name] for p in parts], axis=0) for name in parts[0]}


def _assert_within(actual, expected, bounds, scale_rtol=1e-12):
    for name, value in expected.items():
        slack = bounds[name] + scale_rtol * float(np.max(np.abs(value)))
        error = float(np.max(np.abs(actual[name] - value)))
        assert error <= slack, f"{name}: error {error:.3g} above the bound {slack:.3g}"


# ----------------------------------------------------------------- the run
def test_the_server_step_gets_one_combined_reply_every_round(runs):
    (plain, _, _), (secure, _, records) = runs
    assert [len(seen) for seen in secure.seen] == [1] * len(secure.seen)
    assert all(list(seen) == [COMBINED_ID] for seen in secure.seen)
    assert all(len(seen) == M for seen in plain.seen)  # the plain server reads every reply
    kinds = [r.kind for r in records]
    assert kinds[0] == "moments" and "assign" in kinds and kinds[-1] == "em"
    for record in records:  # every round went through the protocol, every client sent
        assert record.metrics["secure_senders"] == M
        assert record.metrics["secure_bytes_up"] > 0 and record.metrics["secure_seconds"] > 0


def test_each_round_kind_combined_is_the_sum_of_the_replies_within_the_bound(runs):
    (plain, _, _), (secure, _, records) = runs
    # round 1 (moments) starts from the same state in both runs: the same replies
    combined = _moments_sums(secure.seen[0][COMBINED_ID])
    expected = _summed([_moments_sums(r) for r in plain.seen[0].values()])
    bounds = {k: records[0].metrics[f"secure_bound_{k}"] for k in expected}
    _assert_within(combined, expected, bounds)
    # the first assign round (statistics about the broadcast shift), summed by secure_round
    replies, shift = plain.seen[1], plain.shifts[1]
    message = Message("assign", {"shift": shift})
    clips = clip_ranges("stats", 2, max_rows=350, bound=CLIP, noise_multiplier=Z, margin=10.0)
    out, report = secure_round(
        "stats", message, replies, clips, covariance_type="full", bits=40, insecure_seed=0
    )
    shift = _np(shift)
    expected = _summed([_stats_about_origin(r, shift) for r in replies.values()])
    _assert_within(_stats_about_origin(out, shift), expected, report.error_bound)


def test_the_secure_run_gives_the_plain_runs_mixture_within_the_quantisation_error(runs):
    (_, plain, _), (_, secure, records) = runs
    # the largest error of a summed value relative to its clipping range, any round: the
    # clipping ranges are of the values' scale (N rows times B^0, B, B^2), and EM's few
    # rounds carry a relative error of the sums into the parameters with a modest factor
    worst = max(
        v / r.metrics[k.replace("bound", "clip")]
        for r in records
        for k, v in r.metrics.items()
        if k.startswith("secure_bound_")
    )
    assert 1e-15 < worst < 1e-11  # 48 bits, 4 clients: about 2 m^2 / 2**48
    for name, tensor in plain.state.params.tensors().items():
        assert_close_scaled(
            secure.state.params.tensors()[name], tensor, rtol=1e3 * worst, err_msg=name
        )


def test_coarse_quantisation_moves_the_mixture_by_about_its_bound():
    """The comparison above can fail: at 20 bits the mixture moves by far more than the
    48-bit tolerance, and stays within the 20-bit bound's tolerance."""
    _, plain, _ = _run(None, max_iter=1, kmeans_rounds=1)
    _, coarse, records = _run(SecureSum(bits=20, max_rows=MAX_ROWS), max_iter=1, kmeans_rounds=1)
    worst = max(
        v / r.metrics[k.replace("bound", "clip")]
        for r in records
        for k, v in r.metrics.items()
        if k.startswith("secure_bound_")
    )
    moved = float((coarse.state.params.means - plain.state.params.means).abs().max())
    scale = float(plain.state.params.means.abs().max())
    assert moved / scale > 1e-9
    assert_close_scaled(coarse.state.params.means, plain.state.params.means, rtol=1e3 * worst)


# ----------------------------------------------------------------- drops
def test_a_client_silent_after_masking_stays_in_the_sum_and_the_round_goes_on():
    m = 6
    _, plain, _ = _run(None, m=m, max_iter=2, kmeans_rounds=1)
    _, secure, records = _run(
        SecureSum(unresponsive=0.25, max_rows=MAX_ROWS), m=m, max_iter=2, kmeans_rounds=1
    )
    silent = [r.metrics["secure_unresponsive"] for r in records]
    assert sum(silent) > 0 and max(silent) <= m - 4  # t = 4 of 6
    for name, tensor in plain.state.params.tensors().items():
        assert_close_scaled(secure.state.params.tensors()[name], tensor, rtol=1e-8, err_msg=name)


def test_drops_before_and_after_masking_at_the_round_level():
    rng = np.random.default_rng(1)
    replies = {
        c: Message(
            "moments",
            {
                "n_samples": torch.tensor(float(40 + c)),
                "mean": torch.as_tensor(rng.uniform(-1, 1, 3)),
                "m2": torch.as_tensor(rng.uniform(1, 20, 3)),
            },
        )
        for c in range(5)
    }
    clips = clip_ranges("moments", 1, max_rows=50, bound=CLIP, noise_multiplier=0.0, margin=0.0)
    out, report = secure_round(
        "moments", Message("moments"), replies, clips, dropped={1}, unresponsive={3}
    )
    assert report.senders == (0, 2, 3, 4) and report.unresponsive == (3,)
    expected = _summed([_moments_sums(replies[c]) for c in (0, 2, 3, 4)])  # 1 left out
    _assert_within(_moments_sums(out), expected, report.error_bound)
    # t = 3 of 5 (a majority): three silent clients leave two to reveal, one too few
    with pytest.raises(ValueError, match="threshold=3"):
        secure_round("moments", Message("moments"), replies, clips, unresponsive={2, 3, 4})


# ----------------------------------------------------------------- encodings
def test_scatter_encoding_sums_to_the_pooled_scatter():
    rng = np.random.default_rng(2)
    parts = [rng.normal(c, 1.0 + c, (30 + 10 * c, 3)) for c in range(3)]
    tensors = []
    for X in parts:
        mean = X.mean(0)
        centred = X - mean
        tensors.append(
            {
                "n_samples": torch.tensor(float(len(X))),
                "mean": torch.as_tensor(mean),
                "scatter": torch.as_tensor(centred.T @ centred),
            }
        )
    message = Message("vb_prior")
    encoded = [encode("scatter", t, message, None) for t in tensors]
    total = {k: sum(e[k] for e in encoded) for k in encoded[0]}
    pooled = decode("scatter", total, message, None)
    X = np.vstack(parts)
    centred = X - X.mean(0)
    assert float(pooled["n_samples"]) == len(X)
    assert_close_scaled(pooled["mean"], X.mean(0), rtol=1e-12)
    assert_close_scaled(pooled["scatter"], centred.T @ centred, rtol=1e-12)


def test_clip_ranges_follow_the_rows_bound_and_the_noise_margin():
    z = 2.0
    clips = clip_ranges("stats", 4, max_rows=100, bound=3.0, noise_multiplier=z, margin=10.0)
    # block shares of z: counts 8, sums 2.5, second 1 / sqrt(3 - 1/64 - 1/6.25)
    second_share = 1 / np.sqrt(3 - 1 / 64 - 1 / 6.25)
    assert clips["counts"] == pytest.approx(100 + 10 * 8 * z)
    assert clips["sums"] == pytest.approx(100 * 3 + 10 * 2.5 * z * 3)
    assert clips["second"] == pytest.approx((100 + 10 * second_share * z) * 9)
    assert clips["n_samples"] == pytest.approx(100 + 10 * 8 * z * 2)  # sqrt(K) = 2


def test_a_value_outside_the_public_range_is_refused_naming_the_client():
    with pytest.raises(ValueError, match=r"client 0: tensor 'counts' .* widen clip_range"):
        run_simulation(
            recording_em(**_params(max_iter=1, kmeans_rounds=1, standardize=False)),
            _clients(),
            privacy=_policy(),
            secure_sum=SecureSum(max_rows=10, noise_margin=0.0),
        )


# ----------------------------------------------------------------- refusals
def test_without_differential_privacy_secure_rounds_are_refused():
    with pytest.raises(ValueError, match=r"no private form .*dp_mode"):
        run_simulation(
            FederatedEM(2, max_iter=2, random_state=0),
            _clients(),
            privacy=PrivacyPolicy(min_rows=1),
            secure_sum=True,
        )


def test_personal_mixture_weights_are_refused():
    with pytest.raises(ValueError, match='mixture_weights="personal": its server step reads'):
        run_simulation(
            FederatedEM(**_params(mixture_weights="personal")),
            _clients(),
            privacy=_policy(),
            secure_sum=True,
        )


def test_local_mode_is_refused():
    with pytest.raises(ValueError, match='dp_mode="local"'):
        run_simulation(
            FederatedEM(**_params(dp_mode="local")), _clients(), privacy=_policy(), secure_sum=True
        )


def test_kinds_without_an_additive_private_form_are_refused():
    with pytest.raises(ValueError, match=r"'centroids'.*no private form"):
        additive_release(FederatedEM(2), "centroids")
    with pytest.raises(ValueError, match=r"'local_fit'.*'fit', which is not a sum"):
        additive_release(FedGenGMM(n_components=2), "local_fit")
    assert additive_release(FederatedEM(2), "em") == "stats"
    assert additive_release(FederatedEM(2), "moments") == "moments"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        SecureSum(threshold=1.0)
    with pytest.raises(ValueError, match="bits"):
        SecureSum(bits=64)
    with pytest.raises(ValueError, match="below 1"):
        SecureSum(dropped=0.5, unresponsive=0.5)
    with pytest.raises(ValueError, match="insecure_seed"):
        SecureSum(insecure_seed="1")
    with pytest.raises(TypeError, match="secure_sum must be"):
        run_simulation(FederatedEM(**_params()), _clients(), privacy=_policy(), secure_sum="yes")
