"""Secure sums (fednovelty.federated.trust.secure): the server's sum against the float sum in numpy,
dropouts before and after masking, the server's view of one client against uniform noise on
the ring, and the errors a caller meets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.federated.trust.secure import (
    PRGS,
    ClientState,
    error_bound,
    quantization_levels,
    quantize,
    reveal_shares,
    secure_sum,
)

K, D = 4, 3
CLIP = {"counts": 500.0, "sums": 2_000.0, "second": 50_000.0, "n_samples": 1_000.0}


def statistics(m: int, seed: int = 0) -> dict[int, dict[str, torch.Tensor]]:
    """Mixture statistics of ``m`` clients, in range of :data:`CLIP`, as numpy draws."""
    rng = np.random.default_rng(seed)
    clients = {}
    for c in range(m):
        counts = rng.uniform(0, 200, K)
        sums = rng.normal(0, 300, (K, D))
        x = rng.normal(0, 5, (K, 20, D))
        second = np.einsum("kni,knj->kij", x, x) * 40
        clients[10 + 3 * c] = {
            "counts": torch.tensor(counts),
            "sums": torch.tensor(sums),
            "second": torch.tensor(second),
            "n_samples": torch.tensor(float(rng.integers(100, 900)), dtype=torch.float64),
        }
    return clients


def plain_sum(clients, ids) -> dict[str, np.ndarray]:
    return {
        name: np.sum([clients[c][name].numpy() for c in ids], axis=0) for name in clients[ids[0]]
    }


@pytest.mark.parametrize("m", [3, 7])
@pytest.mark.parametrize("prg", PRGS)
def test_the_secure_sum_is_the_float_sum_within_the_quantisation_bound(m, prg):
    clients = statistics(m)
    sums, report = secure_sum(
        clients, clip_range=CLIP, threshold=m // 2 + 1, insecure_seed=1, prg=prg
    )
    expected = plain_sum(clients, sorted(clients))
    levels = (2**32 - 1) // m
    assert report.levels == levels
    for name, want in expected.items():
        bound = m * 2 * CLIP[name] / levels + 8 * m * CLIP[name] * 2**-52
        assert report.error_bound[name] == pytest.approx(bound, rel=1e-12)
        assert bound < 3e-8 * CLIP[name]  # relative to the values' scale
        got = sums[name].numpy()
        assert got.shape == want.shape and sums[name].dtype == torch.float64
        assert np.max(np.abs(got - want)) <= bound


@pytest.mark.parametrize("prg", PRGS)
def test_a_coarse_ring_still_keeps_the_bound_and_rounds_without_bias(prg):
    """16 bits, three clients: 21,845 levels, steps of 2 clip / 21845; the error of each sum
    stays under three steps, and averages to about zero (stochastic rounding)."""
    rng = np.random.default_rng(5)
    clients = {c: {"x": torch.tensor(rng.uniform(-1, 1, 4000))} for c in range(3)}
    sums, report = secure_sum(
        clients, clip_range=1.0, threshold=2, bits=16, insecure_seed=2, prg=prg
    )
    step = 2 / 21845
    errors = sums["x"].numpy() - plain_sum(clients, [0, 1, 2])["x"]
    assert np.max(np.abs(errors)) <= report.error_bound["x"] <= 3 * step * (1 + 1e-9)
    assert np.max(np.abs(errors)) > 0.5 * step  # it did quantise
    # each input's rounding error has variance <= step^2 / 4: the mean of 4000 sums of three
    assert abs(errors.mean()) < 5 * np.sqrt(3 / 4 / 4000) * step


def test_stochastic_rounding_rounds_up_as_often_as_the_fraction_says():
    levels, clip = 100, 1.0
    step = 2 * clip / levels
    values = np.full(20_000, -clip + 37.25 * step)  # a quarter of a step above level 37
    q = quantize(values, clip, levels, SeededNoise(0))
    assert set(np.unique(q)) == {37, 38}
    assert abs(np.mean(q == 38) - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 20_000)


@pytest.mark.parametrize("dropped", [{13}, {10, 25}])
def test_clients_dropped_before_masking_leave_the_sum_of_the_survivors(dropped):
    clients = statistics(7, seed=3)
    sums, report = secure_sum(
        clients, clip_range=CLIP, threshold=4, dropped=dropped, insecure_seed=4
    )
    survivors = [c for c in sorted(clients) if c not in dropped]
    assert report.senders == tuple(survivors)
    expected, everyone = plain_sum(clients, survivors), plain_sum(clients, sorted(clients))
    for name in expected:
        assert report.error_bound[name] == pytest.approx(
            error_bound(CLIP[name], 613566756, 7 - len(dropped))
        )
        assert np.max(np.abs(sums[name].numpy() - expected[name])) <= report.error_bound[name]
    # the dropped clients' statistics are really out of it
    assert np.max(np.abs(sums["counts"].numpy() - everyone["counts"])) > 1.0


def test_clients_silent_after_masking_stay_in_the_sum():
    clients = statistics(7, seed=6)
    sums, report = secure_sum(
        clients, clip_range=CLIP, threshold=4, dropped={16}, unresponsive={10, 28}, insecure_seed=0
    )
    kept = [c for c in sorted(clients) if c != 16]
    expected = plain_sum(clients, kept)
    for name in expected:
        assert np.max(np.abs(sums[name].numpy() - expected[name])) <= report.error_bound[name]
    assert report.bytes_up[10]["unmask"] == 0 and report.bytes_up[13]["unmask"] > 0


def test_masks_cancel_exactly_so_a_test_seed_fixes_the_sum_although_every_mask_is_fresh():
    clients = statistics(3, seed=8)
    first, report1 = secure_sum(clients, clip_range=CLIP, threshold=2, insecure_seed=11)
    second, report2 = secure_sum(clients, clip_range=CLIP, threshold=2, insecure_seed=11)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not np.array_equal(report1.server_view[10], report2.server_view[10])


def chi_square_uniform(values: np.ndarray, bits: int, bins: int = 64) -> float:
    """p-value of the chi-square test that ``values`` on the ring of ``2**bits`` are uniform,
    over ``bins`` equal bins."""
    counts = np.bincount((values >> np.uint64(bits - 6)).astype(np.int64), minlength=bins)
    return float(stats.chisquare(counts).pvalue)


@pytest.mark.parametrize("prg", PRGS)
def test_the_server_sees_uniform_noise_whatever_the_client_sent(prg):
    """One client sends all-low or all-high values (its quantised input a constant, 0 or the
    top level); what the server gets from it is uniform on the ring either way, and the two
    cases cannot be told apart by a chi-square test. The same test finds the quantised input
    itself, and a Gaussian one, far from uniform (the test has power)."""
    bits, n = 16, 8192
    rng = np.random.default_rng(9)
    views = {}
    for label, value in (("low", -1.0), ("high", 1.0)):
        clients = {0: {"x": torch.full((n,), value)}}
        clients |= {c: {"x": torch.tensor(rng.uniform(-1, 1, n))} for c in (1, 2)}
        _, report = secure_sum(clients, clip_range=1.0, threshold=2, bits=bits, prg=prg)
        views[label] = report.server_view[0]
        assert chi_square_uniform(views[label], bits) > 1e-6
        quantised = quantize(clients[0]["x"].numpy(), 1.0, report.levels, SeededNoise(9))
        assert np.mean(views[label] == quantised) < 0.01
    table = [
        np.bincount((views[k] >> np.uint64(bits - 6)).astype(np.int64), minlength=64) for k in views
    ]
    assert stats.chi2_contingency(np.array(table)).pvalue > 1e-6
    levels = quantization_levels(bits, 3)
    smooth = quantize(np.clip(rng.normal(0, 0.3, n), -1, 1), 1.0, levels, SeededNoise(10))
    assert chi_square_uniform(smooth, bits) < 1e-12
    assert chi_square_uniform(np.full(n, levels, dtype=np.uint64), bits) < 1e-12


def test_the_view_of_one_client_is_uncorrelated_with_its_input():
    bits, n = 32, 20_000
    rng = np.random.default_rng(12)
    clients = {c: {"x": torch.tensor(rng.uniform(-1, 1, n))} for c in range(3)}
    _, report = secure_sum(clients, clip_range=1.0, threshold=2, bits=bits, insecure_seed=0)
    r = np.corrcoef(clients[1]["x"].numpy(), report.server_view[1].astype(np.float64))[0, 1]
    assert abs(r) < 5 / np.sqrt(n)


def test_too_many_drops_say_how_many_shares_were_needed():
    clients = statistics(5, seed=1)
    with pytest.raises(ValueError, match=r"threshold=4 clients; only 3 answered"):
        secure_sum(clients, clip_range=CLIP, threshold=4, dropped={10, 13})
    with pytest.raises(ValueError, match=r"threshold=4 clients; only 3 answered"):
        secure_sum(clients, clip_range=CLIP, threshold=4, unresponsive={10, 13})


def test_a_value_outside_the_clipping_range_names_the_tensor_and_the_range_it_needs():
    clients = statistics(3, seed=2)
    clients[13]["sums"][1, 2] = -2_500.0
    with pytest.raises(
        ValueError, match=r"client 13: tensor 'sums'.*widen clip_range for 'sums' to at least 2500"
    ):
        secure_sum(clients, clip_range=CLIP, threshold=2)
    clients[13]["sums"][1, 2] = float("nan")
    with pytest.raises(ValueError, match="client 13: tensor 'sums' has non-finite"):
        secure_sum(clients, clip_range=CLIP, threshold=2)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"threshold": 1}, r"threshold must be an integer in \[2, 3\]"),
        ({"threshold": 4}, r"threshold must be an integer in \[2, 3\]"),
        ({"bits": 64}, r"bits must be an integer in \[16, 62\]"),
        ({"dropped": {99}}, r"dropped names clients \[99\]"),
        ({"clip_range": {"counts": 1.0}}, r"clip_range has no range for tensors"),
        ({"clip_range": -1.0}, r"clip_range for 'counts' must be a positive"),
        ({"prg": "mt19937"}, r"prg must be one of"),
    ],
)
def test_bad_settings_are_refused_with_what_was_expected(settings, message):
    arguments = {"clip_range": CLIP, "threshold": 2} | settings
    with pytest.raises(ValueError, match=message):
        secure_sum(statistics(3), **arguments)


def test_clients_must_send_the_same_tensors():
    clients = statistics(3)
    clients[13]["sums"] = torch.zeros(K, D + 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="client 13 sends tensors"):
        secure_sum(clients, clip_range=CLIP, threshold=2)


def test_a_client_never_reveals_both_secrets_of_one_owner():
    state = ClientState(1, None, b"", None, b"", held_shares={2: (b"seed", b"key")})
    assert reveal_shares(state, {2}, set()) == {2: b"seed"}
    assert reveal_shares(state, set(), {2}) == {2: b"key"}
    with pytest.raises(ValueError, match=r"lists \[2\] both as senders and as dropped"):
        reveal_shares(state, {2}, {2})


def test_the_report_counts_the_messages_and_keeps_the_input_dtype():
    clients = {c: {"x": torch.ones(1000, dtype=torch.float32)} for c in range(4)}
    sums, report = secure_sum(clients, clip_range=2.0, threshold=3, bits=24)
    assert sums["x"].dtype == torch.float32
    assert report.n_values == 1000
    for c in range(4):
        assert report.bytes_up[c]["mask"] == 1000 * 3  # 24 bits a value
        assert report.bytes_up[c]["share_keys"] > 0 and report.bytes_down[c]["share_keys"] > 0
        assert report.bytes_down[c]["setup"] == sum(report.bytes_up[o]["setup"] for o in range(4))
    assert set(report.seconds) == {"setup", "share_keys", "mask", "unmask"}
