"""Secure-sum rounds on the Flower engine: SecAgg's four steps as Flower Message-API
exchanges give the mixture of the in-process simulation with ``secure_sum`` and of the plain
private run (same seeds, the same noise), to within the quantisation error.

Most tests run the engine on an in-process grid (``_flower_grid.InProcessGrid``: every
message goes through the real ClientApp, each node's ``context.state`` kept between
messages); the last one runs a real deployment (SuperLink and three SuperNodes) and is
marked slow. References are independent of the code's path: the simulation's plain replies
summed by hand in numpy, numpy float sums, little-endian bytes written by ``int.to_bytes``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from _flower_deployment import deployment
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from _flower_grid import InProcessGrid
from flwr.app import Context, RecordDict
from flwr.app import Message as FlowerMessage

from fednovelty.exceptions import FederationError
from fednovelty.federated import FederatedEM, Message, PrivacyPolicy
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.federated.trust.secure import error_bound, quantization_levels
from fednovelty.runtime import run_simulation
from fednovelty.runtime.flower.client import make_client_app
from fednovelty.runtime.flower.codec import encode_fields, pack_ring, ring_width, unpack_ring
from fednovelty.runtime.flower.config import (
    EngineConfig,
    algorithm_from_run_config,
    secure_from_run_config,
)
from fednovelty.runtime.flower.secure import check_masked, split_masked
from fednovelty.runtime.flower.server import run_rounds
from fednovelty.runtime.secure_rounds import (
    COMBINED_ID,
    SecureSum,
    dequantize_encoded,
    encode,
    quantize_encoded,
    round_clips,
)

M, EPSILON, RELEASES, CLIP, SEED, MAX_ROWS = 3, 1.0, 10, 3.0, 3, 400
Z = calibrate_noise(EPSILON, 1e-5, RELEASES)
BOUNDS = [[-6.0] * 3, [8.0] * 3]


def _parts(m: int = M) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(i, 1.0, (200 + 50 * i, 3)) for i in range(m)]


def _params(**changes) -> dict:
    params = {
        "n_components": 2,
        "bounds": BOUNDS,
        "standardize": True,  # a private moments round first, then assign and em rounds
        "dp_mode": "distributed",
        "dp_noise_multiplier": Z,
        "dp_clip": CLIP,
        "max_iter": 3,
        "kmeans_rounds": 1,
        "random_state": 0,
    }
    return {**params, **changes}


def _node_config(c: int, m: int = M, mode: str = "distributed") -> dict:
    return {
        "partition-id": c,
        "dp-epsilon": EPSILON,
        "dp-releases": RELEASES,
        "dp-clip": CLIP,
        "dp-mode": mode,
        "dp-clients": m,
        "dp-insecure-seed": SEED,
    }


def _run_config(params: dict, **secure) -> dict:
    config = {"secure-sum": True, "secure-max-rows": MAX_ROWS, **secure}
    return {"algorithm": "FederatedEM", "algorithm-params": json.dumps(params), **config}


def _policy(m: int = M) -> PrivacyPolicy:
    return PrivacyPolicy(
        dp=DPPolicy(Z, CLIP, "distributed", m, epsilon=EPSILON, insecure_seed=SEED)
    )


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps every reply (message type, content) it hands back."""

    def __init__(self, app, contexts, silent=()):
        super().__init__(app, contexts, silent)
        self.log: list[tuple[str, FlowerMessage]] = []

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        for message, i in zip(messages, ids, strict=True):
            if i in self.replies:
                self.log.append((message.metadata.message_type, self.replies[i]))
        return ids


def failing(app, nodes: set[int], message_type: str):
    """``app`` whose ``nodes`` raise on messages of ``message_type`` (a node that goes away
    at that step of the protocol)."""

    def call(message, context):
        if context.node_id in nodes and message.metadata.message_type == message_type:
            raise RuntimeError(f"node {context.node_id} went away")
        return app(message, context)

    return call


def _grid(run_config: dict, parts, *, fail=None, mode: str = "distributed") -> RecordingGrid:
    def load(context):
        c = int(context.node_config["partition-id"])
        return c, parts[c]

    contexts = {
        1000 + 7 * c: Context(1, 1000 + 7 * c, _node_config(c, len(parts), mode), RecordDict(),
                              run_config)
        for c in range(len(parts))
    }  # fmt: skip
    app = make_client_app(load)
    if fail is not None:
        app = failing(app, *fail)
    return RecordingGrid(app, contexts)


def recording(algorithm):
    """Keep a copy of the replies each server step of ``algorithm`` got."""
    algorithm.seen = []
    step = algorithm.server_step

    def server_step(state, replies):
        algorithm.seen.append(
            {c: Message(r.kind, {k: v.clone() for k, v in r.tensors.items()}) for c, r in
             replies.items()}
        )  # fmt: skip
        return step(state, replies)

    algorithm.server_step = server_step
    return algorithm


def _flower_run(params: dict, parts, *, fail=None, engine=None, **secure):
    run_config = _run_config(params, **secure)
    grid = _grid(run_config, parts, fail=fail)
    algorithm = recording(algorithm_from_run_config(run_config))
    result = run_rounds(
        grid, algorithm, engine or EngineConfig(), secure=secure_from_run_config(run_config)
    )
    return grid, algorithm, result


def _simulate(params: dict, parts, secure: SecureSum | None, m: int = M):
    clients = {c: torch.as_tensor(X) for c, X in parts.items()}
    algorithm = recording(FederatedEM(**params))
    result = run_simulation(algorithm, clients, privacy=_policy(m), secure_sum=secure)
    return algorithm, result


def _worst(history) -> float:
    """The largest quantisation bound of any summed value over its range, any round."""
    return max(
        v / r.metrics[k.replace("bound", "clip")]
        for r in history
        for k, v in r.metrics.items()
        if k.startswith("secure_bound_")
    )


@pytest.fixture(scope="module")
def task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
            patch.setattr(TaskIdentity, name, value)
        yield


@pytest.fixture(scope="module")
def runs(task_identity):
    parts = dict(enumerate(_parts()))
    flower = _flower_run(_params(), parts)
    simulated = _simulate(_params(), parts, SecureSum(max_rows=MAX_ROWS))
    plain = _simulate(_params(), parts, None)
    return flower, simulated, plain


# ----------------------------------------------------------------- the run
def test_flower_secure_rounds_give_the_simulations_and_the_plain_runs_mixture(runs):
    (_, _, flower), (_, simulated), (_, plain) = runs
    worst = _worst(flower.history)
    assert 1e-16 < worst < 1e-11  # 48 bits, 3 nodes: about 2 m^2 / 2**48
    for reference in (simulated, plain):
        for name, tensor in reference.state.params.tensors().items():
            assert_close_scaled(
                flower.state.params.tensors()[name], tensor, rtol=1e3 * worst, err_msg=name
            )
    kinds = [r.kind for r in flower.history]
    assert kinds[0] == "moments" and "assign" in kinds and kinds[-1] == "em"


def test_the_server_step_gets_one_combined_reply_and_the_loop_only_masked_vectors(runs):
    (grid, algorithm, flower), _, (plain_em, _) = runs
    assert all(list(seen) == [COMBINED_ID] for seen in algorithm.seen)
    assert len(algorithm.seen) == len(flower.history)
    width = ring_width(48)
    trains = [reply for kind, reply in grid.log if kind == "train"]
    assert len(trains) == M * len(flower.history)
    for reply in trains:  # every tensor a node sends in a round is packed ring values
        for array in reply.content.array_records["fednovelty.tensors"].values():
            assert array.dtype == "uint8" and array.shape[-1] == width
    kinds = {kind for kind, _ in grid.log}
    assert kinds == {"train", "query.secagg_keys", "query.secagg_shares", "query.secagg_reveal"}
    # round 1 (moments) starts from the same state in both runs: the combined reply is the
    # sum of the plain run's replies, by hand in numpy, within the stated bound
    combined = algorithm.seen[0][COMBINED_ID].tensors
    replies = plain_em.seen[0].values()
    n = sum(float(r.tensors["n_samples"]) for r in replies)
    total = sum(r.tensors["n_samples"].numpy() * r.tensors["mean"].numpy() for r in replies)
    squares = sum(
        r.tensors["m2"].numpy() + r.tensors["n_samples"].numpy() * r.tensors["mean"].numpy() ** 2
        for r in replies
    )
    metrics = flower.history[0].metrics
    assert abs(float(combined["n_samples"]) - n) <= metrics["secure_bound_n_samples"]
    # the summed encoded form back from the combined reply (the decoding's algebra): within
    # each sum's bound plus float64 round-off of the decoding (1e-12 of the values)
    n_sum, mean = float(combined["n_samples"]), combined["mean"].numpy()
    for name, summed, expected in (
        ("total", n_sum * mean, total),
        ("squares", combined["m2"].numpy() + n_sum * mean**2, squares),
    ):
        slack = metrics[f"secure_bound_{name}"] + 1e-12 * float(np.abs(expected).max())
        assert float(np.abs(summed - expected).max()) <= slack, name


def test_round_metrics_count_every_step_and_every_message(runs):
    (_, _, flower), _, _ = runs
    for record in flower.history:
        metrics = record.metrics
        assert metrics["secure_senders"] == M and metrics["secure_dropped"] == 0
        assert metrics["secure_unresponsive"] == 0 and metrics["secure_seconds"] > 0
        # every Flower message of the round against the round's train exchange alone
        assert metrics["secure_wire_bytes_up"] > metrics["wire_bytes_up"] > 0
        assert metrics["secure_wire_bytes_down"] > metrics["wire_bytes_down"] > 0
        assert metrics["secure_bytes_up"] <= metrics["secure_wire_bytes_up"]


# ----------------------------------------------------------------- dropouts
def test_a_node_gone_after_sharing_its_keys_is_left_out_and_the_run_goes_on(task_identity):
    """Node of client 1 fails at every round's masked-input step, after its keys and
    shares: t = 2 of 3, so the two others' sum is unmasked (its pairwise masks rebuilt) and
    the mixture is the simulation's over clients 0 and 2 (the same noise: 1/3 of the
    variance each, as the node configs say)."""
    params = _params(max_iter=2)
    parts = _parts()
    gone = 1000 + 7 * 1
    _, _, flower = _flower_run(params, dict(enumerate(parts)), fail=({gone}, "train"))
    kept = {0: parts[0], 2: parts[2]}
    _, simulated = _simulate(params, kept, SecureSum(max_rows=MAX_ROWS))
    for record in flower.history:
        assert record.metrics["secure_senders"] == 2 and record.metrics["secure_dropped"] == 1
        assert not record.failed and record.replied == (0, 2)
        assert [c for c, _ in record.dropped] == [1]
        assert "went away" in record.dropped[0][1]
    worst = _worst(flower.history)
    for name, tensor in simulated.state.params.tensors().items():
        assert_close_scaled(
            flower.state.params.tensors()[name], tensor, rtol=1e3 * worst, err_msg=name
        )


def test_a_node_silent_after_its_masked_input_stays_in_the_sum(task_identity):
    params = _params(max_iter=2)
    parts = dict(enumerate(_parts()))
    silent = 1000 + 7 * 2
    _, _, flower = _flower_run(params, parts, fail=({silent}, "query.secagg_reveal"))
    _, simulated = _simulate(params, parts, SecureSum(max_rows=MAX_ROWS))
    for record in flower.history:
        assert record.metrics["secure_senders"] == M
        assert record.metrics["secure_unresponsive"] == 1
    worst = _worst(flower.history)
    for name, tensor in simulated.state.params.tensors().items():
        assert_close_scaled(
            flower.state.params.tensors()[name], tensor, rtol=1e3 * worst, err_msg=name
        )


def test_more_drops_than_the_threshold_allows_fail_the_rounds_then_the_run(task_identity):
    gone = {1000, 1007}  # two of three fail after sharing: one masked input, t = 2
    engine = EngineConfig(max_failed_rounds=2)
    with pytest.raises(FederationError, match=r"2 round\(s\) in a row .* went away"):
        _flower_run(_params(), dict(enumerate(_parts())), fail=(gone, "train"), engine=engine)


# ----------------------------------------------------------------- refusals
NO_DP = {k: v for k, v in _params().items() if not k.startswith("dp_")}


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (NO_DP, "no private form"),
        (_params(dp_mode="local"), 'dp_mode="local"'),
        (_params(mixture_weights="personal"), 'mixture_weights="personal"'),
    ],
)
def test_runs_the_simulation_refuses_are_refused_before_any_message(task_identity, params, match):
    run_config = _run_config(params)
    grid = _grid(run_config, _parts())
    with pytest.raises(ValueError, match=match):
        run_rounds(
            grid,
            algorithm_from_run_config(run_config),
            EngineConfig(),
            secure=secure_from_run_config(run_config),
        )
    assert grid.sent == []


def test_a_round_without_an_additive_private_form_is_refused_before_sending(task_identity):
    """Every round of private federated EM has an additive form; its ``moments`` round
    declared without one (as k-FED's centroids are) is refused before any message."""
    from fednovelty.runtime.flower.secure import SecureGridTransport, SecureValidator

    run_config = _run_config(_params())
    grid = _grid(run_config, _parts())
    algorithm = algorithm_from_run_config(run_config)
    declared = algorithm.reply_spec
    algorithm.reply_spec = lambda kind: replace(declared(kind), private=None)
    transport = SecureGridTransport(
        grid,
        dict.fromkeys(grid.contexts),
        EngineConfig(),
        np.random.default_rng(0),
        algorithm=algorithm,
        settings=secure_from_run_config(run_config),
        validator=SecureValidator(algorithm=algorithm),
    )
    with pytest.raises(ValueError, match=r"'moments' cannot go through a secure sum"):
        transport.exchange(1, algorithm.configure(algorithm.start()))
    assert grid.sent == []


def test_secure_settings_are_read_from_the_run_config():
    assert secure_from_run_config({}) is None
    assert secure_from_run_config({"secure-sum": False}) is None
    settings = secure_from_run_config(
        {"secure-sum": True, "secure-max-rows": 500, "secure-bits": 40, "seed": 7}
    )
    assert settings == SecureSum(threshold=0.5, bits=40, max_rows=500)
    with pytest.raises(ValueError, match=r"run_config 'secure-prg'.*32 bits") as caught:
        secure_from_run_config({"secure-sum": "true", "secure-max-rows": 5, "secure-prg": "flower"})
    assert caught.type.__name__ == "InsecurePRGError"
    with pytest.raises(ValueError, match="'secure-seed' is refused"):
        secure_from_run_config({"secure-sum": True, "secure-max-rows": 5, "secure-seed": 2})
    with pytest.raises(ValueError, match="'secure-max-rows' is required"):
        secure_from_run_config({"secure-sum": True})
    with pytest.raises(ValueError, match="run_config 'secure-bits' must be an int in"):
        secure_from_run_config({"secure-sum": True, "secure-max-rows": 5, "secure-bits": 80})
    with pytest.raises(ValueError, match="'secure-max-rows' must be an integer"):
        secure_from_run_config({"secure-sum": True, "secure-max-rows": 5.5})
    with pytest.raises(ValueError, match="'secure-threshold' must be a number"):
        secure_from_run_config({"secure-sum": True, "secure-max-rows": 5, "secure-threshold": "x"})
    with pytest.raises(ValueError, match="'secure-sum' must be true or false"):
        secure_from_run_config({"secure-sum": "yes"})


# ----------------------------------------------------------------- the node's checks
def _ask(grid, node: int, message_type: str, content: RecordDict):
    """One message to ``node`` through the ClientApp; its reply (content or error)."""
    message = FlowerMessage(content, dst_node_id=node, message_type=message_type, group_id="1")
    (i,) = grid.push_messages([message])
    (reply,) = grid.pull_messages([i])
    return reply


def _keys_and_shares(grid, nodes):
    """Steps 1 and 2 of round 1 on ``nodes``; the public fields relayed at step 2."""
    from fednovelty.runtime.flower.codec import decode_fields

    header = {"round": 1, "attempt": 0}
    keys = {}
    for node in nodes:
        fields, reply_header = decode_fields(
            _ask(grid, node, "query.secagg_keys", encode_fields({}, **header)).content
        )
        keys[int(reply_header["client_id"])] = fields
    clients = sorted(keys)
    relay = {
        "clients": clients,
        "mask_publics": [keys[c]["mask_public"] for c in clients],
        "encryption_publics": [keys[c]["encryption_public"] for c in clients],
        "threshold": 2,  # a majority of 3, the nodes' default floor
    }
    return relay, header


def _error(reply) -> str:
    assert reply.has_error(), "the node answered where it must refuse"
    return reply.error.reason


def test_a_node_refuses_its_keys_relayed_changed_and_messages_out_of_order(task_identity):
    grid = _grid(_run_config(_params()), _parts())
    nodes = sorted(grid.contexts)
    relay, header = _keys_and_shares(grid, nodes)
    swapped = {**relay, "mask_publics": relay["mask_publics"][::-1]}
    reason = _error(_ask(grid, nodes[0], "query.secagg_shares", encode_fields(swapped, **header)))
    assert "own public keys unchanged" in reason
    later = encode_fields(relay, round=2, attempt=0)
    assert "not round 2" in _error(_ask(grid, nodes[0], "query.secagg_shares", later))
    fresh = _grid(_run_config(_params()), _parts())
    reveal = encode_fields({"senders": [0, 1, 2]}, **header)
    reason = _error(_ask(fresh, nodes[0], "query.secagg_reveal", reveal))
    assert "must come in order" in reason


def test_a_node_reveals_nothing_for_fewer_senders_than_the_threshold(task_identity):
    from fednovelty.runtime.flower.codec import decode_fields

    grid = _grid(_run_config(_params()), _parts())
    nodes = sorted(grid.contexts)
    relay, header = _keys_and_shares(grid, nodes)
    shares = {}
    for node in nodes:
        fields, h = decode_fields(
            _ask(grid, node, "query.secagg_shares", encode_fields(relay, **header)).content
        )
        shares[int(h["client_id"])] = dict(
            zip(fields["holders"], fields["ciphertexts"], strict=True)
        )
    # step 3 on node 0 (client 0): a moments round, the shares relayed to it
    algorithm = algorithm_from_run_config(_run_config(_params()))
    broadcast = algorithm.configure(algorithm.start())
    from fednovelty.runtime.flower.codec import SECAGG, encode_message, fields_record

    content = encode_message(broadcast, **header)
    content[SECAGG] = fields_record(
        {"clients": [0, 1, 2], "sources": [1, 2], "ciphertexts": [shares[1][0], shares[2][0]]}
    )
    masked = _ask(grid, nodes[0], "train", content)
    assert not masked.has_error()
    # t = 2 of 3: the server names client 0 alone as a sender, the others as dropped
    alone = encode_fields({"senders": [0], "dropped": [1, 2]}, **header)
    assert "fewer than t=2" in _error(_ask(grid, nodes[0], "query.secagg_reveal", alone))
    both = encode_fields({"senders": [0, 1], "dropped": [1]}, **header)
    assert "both as senders and as dropped" in _error(
        _ask(grid, nodes[0], "query.secagg_reveal", both)
    )
    fine = encode_fields({"senders": [0, 1], "dropped": [2]}, **header)
    fields, _ = decode_fields(_ask(grid, nodes[0], "query.secagg_reveal", fine).content)
    assert fields["owners"] == [0, 1, 2] and len(fields["shares"]) == 3
    # its secrets are gone once revealed
    assert "must come in order" in _error(_ask(grid, nodes[0], "query.secagg_reveal", fine))


def test_a_node_without_secure_sum_in_its_run_config_takes_no_part(task_identity):
    run_config = {**_run_config(_params()), "secure-sum": False}
    grid = _grid(run_config, _parts())
    reply = _ask(grid, 1000, "query.secagg_keys", encode_fields({}, round=1, attempt=0))
    assert "no 'secure-sum = true'" in _error(reply)


# ----------------------------------------------------------------- pure pieces
@pytest.mark.parametrize("bits", [20, 48, 62])
def test_ring_values_pack_to_their_low_little_endian_bytes(bits):
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 2**bits, 50, dtype=np.uint64)
    packed = pack_ring(values, bits)
    width = (bits + 7) // 8
    assert packed.shape == (50, width) and packed.dtype == np.uint8
    for value, row in zip(values, packed, strict=True):
        assert bytes(row) == int(value).to_bytes(width, "little")
    assert np.array_equal(unpack_ring(packed, bits), values)
    with pytest.raises(ValueError, match=f"below 2\\*\\*{bits}"):
        pack_ring(np.array([2**bits], dtype=np.uint64), bits)
    with pytest.raises(ValueError, match=r"\(n, \d\) uint8"):
        unpack_ring(packed.astype(np.int16), bits)


def test_quantised_encoded_tensors_sum_to_the_float_sum_within_the_bound():
    rng = np.random.default_rng(5)
    clips = {"counts": 50.0, "sums": 150.0}
    clients = [
        {
            "counts": torch.as_tensor(rng.uniform(0, 50, 4)),
            "sums": torch.as_tensor(rng.uniform(-150, 150, (4, 3))),
        }
        for _ in range(3)
    ]
    levels = quantization_levels(32, 3)
    vectors = [quantize_encoded(c, t, clips, levels, SeededNoise(c)) for c, t in enumerate(clients)]
    assert all(v.dtype == np.uint64 and v.shape == (16,) for v in vectors)
    total = vectors[0] + vectors[1] + vectors[2]
    layout = {"counts": (4,), "sums": (4, 3)}
    sums = dequantize_encoded(total, layout, clips, levels, 3)
    for name, clip in clips.items():
        expected = np.sum([c[name].numpy() for c in clients], axis=0)
        assert sums[name].shape == expected.shape
        assert float(np.abs(sums[name].numpy() - expected).max()) <= error_bound(clip, levels, 3)
    with pytest.raises(ValueError, match=r"client 7: tensor 'counts' .* outside"):
        quantize_encoded(7, {"counts": torch.tensor([60.0])}, clips, levels, SeededNoise(7))
    with pytest.raises(ValueError, match="layout"):
        dequantize_encoded(total[:3], layout, clips, levels, 3)


def test_round_clips_are_the_rows_bound_ranges_and_noiseless_in_central_mode():
    algorithm = FederatedEM(**_params(dp_mode="central"))
    clips = round_clips(algorithm, "stats", 2, max_rows=100, noise_margin=10.0)
    assert clips["counts"] == 100 and clips["n_samples"] == 100
    assert clips["sums"] == pytest.approx(100 * CLIP) and clips["second"] == pytest.approx(
        100 * CLIP**2
    )
    noisy = round_clips(FederatedEM(**_params()), "stats", 2, max_rows=100, noise_margin=10.0)
    assert all(noisy[name] > clips[name] for name in ("counts", "sums", "second"))


def _masked_moments(bits: int = 48):
    encoded = encode(
        "moments",
        {"n_samples": torch.tensor(5.0), "mean": torch.zeros(3), "m2": torch.ones(3)},
        Message("moments"),
        None,
    )
    values = np.arange(7, dtype=np.uint64)
    return Message("moments", split_masked(values, encoded, bits))


def test_the_server_gate_checks_the_masked_form():
    broadcast = Message("moments")
    good = _masked_moments()
    check_masked(good, broadcast, 3, "moments", 48)
    tensors = good.tensors
    wide = torch.zeros(4, 6, dtype=torch.uint8)
    cases = [
        ("must be uint8 of shape", {**tensors, "total": tensors["total"].to(torch.int16)}),
        ("are not the encoded form", {"n_samples": tensors["n_samples"], "total": wide}),
        ("the encoded form of a 'moments' reply is", dict(reversed(tensors.items()))),
        ("the encoded form of a 'moments' reply is", {**tensors, "extra": tensors["total"]}),
        ("has shape \\(4,\\)", {**tensors, "total": wide, "squares": wide}),
    ]
    for match, bad in cases:
        with pytest.raises(InvalidReplyError, match=match):
            check_masked(Message("moments", bad), broadcast, 3, "moments", 48)
    over = tensors["total"].clone()
    over[0, -1] = 255  # the sixth byte of a 44-bit ring's value
    with pytest.raises(InvalidReplyError, match="below 2\\*\\*44"):
        check_masked(Message("moments", {**tensors, "total": over}), broadcast, 3, "moments", 44)


# ----------------------------------------------------------------- a real deployment
#: one EM round: on a deployment each message starts a ClientApp process, four a node a
#: secure round (about a minute on two shared cores; python -m benchmarks.secure_sums --flower).
EM_PARAMS = {
    "n_components": 2,
    "mixture_weights": "global",
    "max_iter": 1,
    "weights_init": [0.5, 0.5],
    "means_init": [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]],
    "precisions_init": np.tile(np.eye(3), (2, 1, 1)).tolist(),
    "bounds": BOUNDS,
    "dp_mode": "distributed",
    "dp_noise_multiplier": Z,
    "dp_clip": CLIP,
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    work = tmp_path_factory.mktemp("flower_secure")
    configs = []
    for i, part in enumerate(_parts()):
        np.save(work / f"part{i}.npy", part)
        configs.append({**_node_config(i), "data-path": str(work / f"part{i}.npy")})
    yield from deployment(configs, work)


@pytest.mark.slow
def test_secure_em_on_a_flower_deployment_equals_the_simulations(federation):
    federation, app = federation
    config = {
        "algorithm": "FederatedEM",
        "algorithm-params": json.dumps(EM_PARAMS),
        "num-nodes": M,
        "secure-sum": True,
        "secure-max-rows": MAX_ROWS,
    }
    result = federation.run_app(app, config, timeout=600)  # a wait, not a budget
    parts = dict(enumerate(_parts()))
    _, simulated = _simulate(EM_PARAMS, parts, SecureSum(max_rows=MAX_ROWS))
    _, plain = _simulate(EM_PARAMS, parts, None)
    assert [r.metrics["secure_senders"] for r in result.history] == [M] * len(result.history)
    worst = _worst(result.history)
    for reference in (simulated, plain):
        for name, tensor in reference.state.params.tensors().items():
            assert_close_scaled(
                result.state.params.tensors()[name], tensor, rtol=1e3 * worst, err_msg=name
            )
