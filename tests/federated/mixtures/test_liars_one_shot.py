"""One lying client in a local-fit round: the one-shot start of federated EM
(``init_params="oneshot"``) and FedGenGMM screen its components by name and fit from the
honest ones.

Ten honest clients hold rows of two blobs (half each); client 10 answers the local-fit round with a
forged mixture: its means x 1e133 (a reply no rows produce, dropped by name in the round's
record), or its honest mixture with one component of weight 0.01 moved to 1e4 in every
feature (small enough that the client's mixture as a whole passes the first round's gross
screen; the component alone is implausible and is dropped by name with a warning). The
one-shot start used to end such a fit with a ``SingularCovarianceError``, or with every
honest client excluded (a ``FederationError``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _liars import Forging

from fednovelty.federated.core.base import Message
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.mixtures.fedgengmm import FedGenGMM
from fednovelty.federated.trust.plausible import ImplausibleComponentWarning, outlying_components
from fednovelty.mixture import MixtureParams, score_samples
from fednovelty.runtime import run_simulation

N_HONEST, LIAR, D = 10, 10, 3
#: how far the lone component is moved (in the round's units, every feature).
FAR = 1e4


def _rows(seed: int, n: int = 60) -> torch.Tensor:
    """``n`` rows, half of them about the origin and half about (4, 4, 4)."""
    g = torch.Generator().manual_seed(seed)
    blob = (torch.arange(n) % 2).unsqueeze(1).to(torch.float64)
    return torch.randn(n, D, dtype=torch.float64, generator=g) + 4.0 * blob


DATA = [_rows(c) for c in range(N_HONEST + 1)]  # client 10 (the liar) holds honest rows
HELD_OUT = _rows(100, 400)


def far_means(reply: Message, message: Message, number: int) -> Message:
    """The liar: its local mixture's means x 1e133."""
    if reply.kind not in ("oneshot", "local_fit"):
        return reply
    return Message(reply.kind, {**reply.tensors, "means": reply.tensors["means"] * 1e133})


def far_component(reply: Message, message: Message, number: int) -> Message:
    """The liar: its honest mixture, component 0 at ``FAR`` with weight 0.01."""
    if reply.kind not in ("oneshot", "local_fit"):
        return reply
    t = dict(reply.tensors)
    weights = t["weights"].clone()
    weights[1:] = weights[1:] * 0.99 / weights[1:].sum()
    weights[0] = 0.01
    means = t["means"].clone()
    means[0] = FAR
    return Message(reply.kind, {**t, "weights": weights, "means": means})


BUILD = {
    "oneshot": lambda **kw: FederatedEM(2, init_params="oneshot", max_iter=5, random_state=0, **kw),
    "fedgengmm": lambda **kw: FedGenGMM(n_components=2, client_components=2, random_state=0, **kw),
}
#: (algorithm, its settings): plain; with a moments round first (the one-shot start) or
#: every fit standardised (FedGenGMM); with the robust option each has.
CASES = [
    ("oneshot", {}),
    ("oneshot", {"standardize": True}),
    ("oneshot", {"aggregation": "trimmed", "trim": 0.2}),
    ("fedgengmm", {}),
    ("fedgengmm", {"standardize": True}),
    ("fedgengmm", {"aggregation": "median"}),
    ("fedgengmm", {"aggregation": "trimmed", "trim": 0.2}),
]


def _fit(algorithm, data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_simulation(algorithm, data, random_state=0)
    return result, caught


def _held_out_log_likelihood(result) -> float:
    return float(score_samples(result.state.params, HELD_OUT).mean())


@pytest.mark.parametrize(("name", "settings"), CASES)
def test_a_local_fit_of_far_means_is_dropped_by_name_and_the_fit_is_the_honest_one(
    name, settings
) -> None:
    build = BUILD[name]
    result, _ = _fit(Forging(build(**settings), LIAR, far_means), DATA)
    drops = [(r.kind, why) for r in result.history for c, why in r.dropped if c == LIAR]
    assert drops and all(why for _, why in drops), result.history
    assert drops[0][0] in ("oneshot", "local_fit")
    honest, _ = _fit(build(**settings), DATA[:LIAR])
    for part, want in honest.state.params.tensors().items():
        got = result.state.params.tensors()[part]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * float(want.abs().max()))


@pytest.mark.parametrize(("name", "settings"), CASES)
def test_a_lone_far_component_is_dropped_by_name_and_the_fit_goes_on(name, settings) -> None:
    """Its component is left out by name (or, after a moments round, the whole reply, which
    lies outside the box the client declared); the held-out log-likelihood is within 0.05
    nats per row of the fit where the liar's client is honest (without the screen 0.6 nats
    lower: the server's refit had spent a component on the far rows)."""
    build = BUILD[name]
    result, caught = _fit(Forging(build(**settings), LIAR, far_component), DATA)
    named = [str(w.message) for w in caught if issubclass(w.category, ImplausibleComponentWarning)]
    drops = [why for r in result.history for c, why in r.dropped if c == LIAR]
    if settings.get("standardize") and name == "oneshot":
        assert drops and "declared moments" in drops[0], drops
    else:
        assert any(f"client {LIAR}: component(s) [0]" in text for text in named), named
        assert not drops  # only the component
    honest, _ = _fit(build(**settings), DATA)
    assert float(result.state.params.means.abs().max()) < 20
    got, want = _held_out_log_likelihood(result), _held_out_log_likelihood(honest)
    assert abs(got - want) < 0.05, (got, want)


def test_honest_clients_lose_no_component() -> None:
    result, caught = _fit(BUILD["oneshot"](), DATA)
    assert not [w for w in caught if issubclass(w.category, ImplausibleComponentWarning)]
    assert not any(r.dropped for r in result.history)


# ---------------------------------------------------------------------- the pure screen
def _mixture(means: list[list[float]], scale: float = 1.0) -> MixtureParams:
    m = torch.tensor(means, dtype=torch.float64)
    k = m.shape[0]
    prec = torch.eye(D, dtype=torch.float64).expand(k, D, D) / scale
    return MixtureParams(torch.full((k,), 1.0 / k, dtype=torch.float64), m, prec, "full")


def test_outlying_components_by_hand() -> None:
    models = {c: _mixture([[0.0] * D, [4.0] * D]) for c in range(6)}
    models[6] = _mixture([[40.0] * D])  # a rare cluster 10 spreads away: honest
    models[7] = _mixture([[0.0] * D, [1e5] * D])  # one component 1e5 away
    models[8] = _mixture([[0.0] * D, [4.0] * D], scale=1e9)  # spreads 3e4 times the others
    models[9] = _mixture([[0.0] * D, [float("nan")] * D])
    assert outlying_components(models) == {7: [1], 8: [0, 1], 9: [1]}


def test_a_claimed_row_count_buys_no_vote() -> None:
    # every client one vote: two far clients of nine cannot move the reference
    models = {c: _mixture([[0.0] * D, [4.0] * D]) for c in range(7)}
    models[7] = models[8] = _mixture([[1e6] * D, [1e6 + 4] * D])
    assert outlying_components(models) == {7: [0, 1], 8: [0, 1]}


def test_fewer_than_three_clients_judge_only_non_finite_components() -> None:
    models = {0: _mixture([[0.0] * D]), 1: _mixture([[1e9] * D, [float("inf")] * D])}
    assert outlying_components(models) == {1: [1]}
