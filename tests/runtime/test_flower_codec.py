"""The Flower codec: fednovelty messages <-> Flower records, bit for bit; the result file;
the plain configuration both sides build the algorithm from; the nodes' data loader; the
error raised where Flower is not installed.

Round trips go through Flower's own wire form (every object deflated to bytes and inflated
back, as the SuperLink stores and forwards them), not just through Python objects.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from fednovelty.federated import FederatedEM, FedGenGMM, Message
from fednovelty.federated.joint_models.joint import JointFedGMM, mlp_learner
from fednovelty.federated.mixtures.factor_em import FederatedFactorEM
from fednovelty.federated.trust import gate
from fednovelty.runtime import run_simulation
from fednovelty.runtime.flower import codec
from fednovelty.runtime.flower.config import (
    EngineConfig,
    algorithm_from_run_config,
    build_algorithm,
)
from fednovelty.runtime.flower.results import (
    FlowerResult,
    algorithm_config,
    load_result,
    save_result,
)


def over_the_wire(content: RecordDict) -> RecordDict:
    """``content`` deflated to bytes object by object and inflated back (Flower's wire)."""
    objects = get_all_nested_objects(content)
    blobs = {object_id: obj.deflate() for object_id, obj in objects.items()}
    return inflate_object_from_contents(content.object_id, blobs)


def assert_same_message(actual: Message, expected: Message) -> None:
    assert actual.kind == expected.kind
    assert list(actual.tensors) == list(expected.tensors)
    for name, tensor in expected.tensors.items():
        got = actual.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor.cpu()), name  # bitwise, NaN-free inputs
    assert actual.scalars == expected.scalars
    assert {k: type(v) for k, v in actual.scalars.items()} == {
        k: type(v) for k, v in expected.scalars.items()
    }


def test_round_trip_keeps_every_bit_dtype_shape_and_scalar_type() -> None:
    gen = torch.Generator().manual_seed(0)
    message = Message(
        "em",
        {
            "stats": torch.randn(4, 3, 3, dtype=torch.float64, generator=gen) * 1e-300,
            "tiny": torch.tensor(5e-324, dtype=torch.float64),  # 0-d, subnormal
            "f32": torch.randn(7, generator=gen),
            "codes": torch.arange(5),
            "mask": torch.tensor([True, False]),
            "empty": torch.zeros(0, 3, dtype=torch.float64),
            "learner.0.weight": torch.randn(2, 3, dtype=torch.float64, generator=gen).T,
        },
        {"flag": True, "count": 2**40, "rate": 0.1 + 1e-17, "covariance_type": "full"},
    )
    content = over_the_wire(codec.encode_message(message, client_id=3, round=2))
    decoded, header = codec.decode_message(content)
    assert_same_message(decoded, message)
    assert header == {"client_id": 3, "round": 2}
    assert decoded.nbytes() == message.nbytes()


@pytest.mark.parametrize("init", ["kmeans", "separated"])
def test_real_algorithm_messages_round_trip(init) -> None:
    X = torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    algorithm = FederatedEM(3, init_params=init, random_state=0)
    state = algorithm.start()
    broadcast = algorithm.configure(state)
    reply = algorithm.client_step(X, broadcast, gate.client_context(0))
    for message in (broadcast, reply):
        decoded, _ = codec.decode_message(over_the_wire(codec.encode_message(message)))
        assert_same_message(decoded, message)


def test_decode_names_what_is_missing_or_too_new() -> None:
    with pytest.raises(codec.CodecError, match=r"fednovelty.tensors"):
        codec.decode_message(RecordDict({"other": ArrayRecord()}))
    content = codec.encode_message(Message("em"))
    content[codec.HEADER] = ConfigRecord({"kind": "em", "version": codec.CODEC_VERSION + 1})
    with pytest.raises(codec.CodecError, match="version"):
        codec.decode_message(content)


def test_encode_refuses_scalars_flower_cannot_carry() -> None:
    with pytest.raises(TypeError, match="'k_range'"):
        codec.encode_message(Message("x", scalars={"k_range": (1, 2)}))
    with pytest.raises(ValueError, match="bfloat16"):
        codec.encode_message(Message("x", {"t": torch.zeros(2, dtype=torch.bfloat16)}))


def test_client_state_survives_the_node_context() -> None:
    state = RecordDict()
    assert codec.load_client_state(state) == {}
    tensors = {"log_weights": torch.tensor([-0.1, -2.5], dtype=torch.float64)}
    codec.store_client_state(state, tensors)
    back = codec.load_client_state(over_the_wire(state))
    assert torch.equal(back["log_weights"], tensors["log_weights"])


def test_wire_bytes_count_payload_and_npy_headers() -> None:
    message = Message("em", {"a": torch.zeros(10, dtype=torch.float64)}, {"s": "full"})
    wire = codec.wire_nbytes(codec.encode_message(message))
    assert message.nbytes() == 80 + 4
    assert 84 < wire < 84 + 400  # one .npy header (128 B) and the names


# ------------------------------------------------------------------ result files
def _run(algorithm, n_clients: int = 3):
    gen = torch.Generator().manual_seed(2)
    clients = [torch.randn(40, 2, dtype=torch.float64, generator=gen) + 4 * c for c in range(3)]
    clients = clients[:n_clients]
    return run_simulation(algorithm, clients, random_state=0)


def _assert_same(a, b, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b), where
        for name in a.__dataclass_fields__:
            _assert_same(getattr(a, name), getattr(b, name), f"{where}.{name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b and type(a) is type(b), where


@pytest.mark.parametrize(
    "algorithm",
    [
        FederatedEM(2, mixture_weights="personal", max_iter=3, tol=0.0),
        FederatedEM(2, init_params="oneshot", acceleration="squarem", max_iter=4, tol=0.0),
        FedGenGMM(n_components=2, k_range=(1, 3)),
        FedGenGMM(n_components=2, k_range=(1, 3), copula=True),
        JointFedGMM(2, 2, 2, learner_factory=mlp_learner, max_iter=2, kmeans_rounds=2),
        FederatedFactorEM(2, 1, standardize=True, prior_strength=3.0, max_iter=3, tol=0.0),
    ],
    ids=[
        "FederatedEM",
        "FederatedEM-squarem",
        "FedGenGMM",
        "FedGenGMM-copula",
        "JointFedGMM",
        "FederatedFactorEM",
    ],
)
def test_result_file_round_trip(algorithm, tmp_path) -> None:
    if isinstance(algorithm, JointFedGMM):
        gen = torch.Generator().manual_seed(3)
        clients = [
            (torch.randn(30, 2, dtype=torch.float64, generator=gen), torch.arange(30) % 2)
            for _ in range(3)
        ]
        run = run_simulation(algorithm, clients, random_state=0)
    else:
        run = _run(algorithm)
    result = FlowerResult(
        run.state,
        run.history,
        run.client_states,
        algorithm=type(algorithm).__name__,
        config=algorithm_config(algorithm),
        dropped=[{"round": 1, "client_id": 4, "node_id": 99, "reason": "no reply"}],
    )
    save_result(result, tmp_path / "out" / "result.safetensors")
    back = load_result(tmp_path / "out" / "result.safetensors")
    _assert_same(back.state, run.state)
    assert back.history == run.history
    _assert_same(back.client_states, run.client_states, "client_states")
    assert (back.algorithm, back.config, back.dropped) == (
        result.algorithm,
        result.config,
        result.dropped,
    )
    assert json.loads(json.dumps(back.config)) == back.config


def test_load_result_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="did the run finish"):
        load_result(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a fednovelty Flower result"):
        load_result(tmp_path / "junk.safetensors")


# ------------------------------------------------------------------ plain configuration
def test_run_config_builds_the_same_algorithm_on_both_sides() -> None:
    run_config = {
        "algorithm": "FederatedEM",
        "algorithm-params": json.dumps(
            {"n_components": 2, "covariance_type": "diag", "dtype": "float32", "max_iter": 4}
        ),
        "seed": 7,
    }
    server, node = algorithm_from_run_config(run_config), algorithm_from_run_config(run_config)
    assert algorithm_config(server) == algorithm_config(node)
    assert server.random_state == 7 and server.dtype == torch.float32
    assert server.covariance_type == "diag" and server.max_iter == 4
    fedgen = build_algorithm("FedGenGMM", {"k_range": [2, 3]})
    assert fedgen.k_range == (2, 3)
    joint = build_algorithm("JointFedGMM", {"n_components": 2, "n_learners": 1, "n_classes": 3})
    assert joint.n_classes == 3


@pytest.mark.parametrize(
    ("run_config", "match"),
    [
        ({}, "no 'algorithm' key"),
        ({"algorithm": "KMeans"}, "must be one of"),
        ({"algorithm": "FedGenGMM", "algorithm-params": "{n_components: 3"}, "JSON object"),
        ({"algorithm": "FedGenGMM", "algorithm-params": "[3]"}, "JSON object"),
        ({"algorithm": "FedGenGMM", "algorithm-params": '{"n_comps": 3}'}, "do not fit FedGenGMM"),
        (
            {"algorithm": "FederatedEM", "algorithm-params": '{"n_components": 2, "dtype": "f16"}'},
            "'dtype'",
        ),
        (
            {
                "algorithm": "JointFedGMM",
                "algorithm-params": '{"n_components": 2, "n_learners": 1, "n_classes": 3, '
                '"learner": "resnet"}',
            },
            "'learner'",
        ),
        ({"algorithm": "JointFedGMM", "algorithm-params": '{"learner": "linear"}'}, "n_components"),
    ],
)
def test_bad_run_config_is_named(run_config, match) -> None:
    with pytest.raises(ValueError, match=match):
        algorithm_from_run_config(run_config)


def test_engine_config_reads_and_checks_keys() -> None:
    engine = EngineConfig.from_run_config(
        {"min-clients": 2, "fraction": 0.5, "round-timeout": 30, "algorithm": "FedGenGMM"}
    )
    assert (engine.min_clients, engine.fraction, engine.round_timeout) == (2, 0.5, 30.0)
    with pytest.raises(ValueError, match="fraction"):
        EngineConfig.from_run_config({"fraction": 0.0})
    with pytest.raises(ValueError, match="min-clients"):
        EngineConfig(min_clients=0)


# ------------------------------------------------------------------ node data and the extra
def test_node_data_from_npy_npz_csv_and_a_shared_file(tmp_path) -> None:
    import pandas as pd
    from flwr.app import Context

    from fednovelty.exceptions import ClientDataError
    from fednovelty.runtime.flower.client import load_node_data

    X = np.arange(24, dtype=np.float64).reshape(8, 3)
    np.save(tmp_path / "x.npy", X)
    np.savez(tmp_path / "xy.npz", X=X, y=np.arange(8) % 2)
    pd.DataFrame({"a": X[:, 0], "label": np.arange(8) % 2, "b": X[:, 1]}).to_csv(
        tmp_path / "x.csv", index=False
    )

    def context(node, run=None):
        return Context(1, 1, node, RecordDict(), run or {})

    client, rows = load_node_data(
        context({"partition-id": 4, "data-path": str(tmp_path / "x.npy")})
    )
    assert client == 4 and np.array_equal(rows, X)
    _, (rows, y) = load_node_data(
        context({"partition-id": 0, "data-path": str(tmp_path / "xy.npz")})
    )
    assert np.array_equal(rows, X) and y.tolist() == [0, 1] * 4
    node = {"partition-id": 0, "data-path": str(tmp_path / "x.csv")}
    _, (rows, y) = load_node_data(context(node, {"label-column": "label"}))
    assert np.array_equal(rows, X[:, :2]) and y.tolist() == [0, 1] * 4
    shared = {"data-path": str(tmp_path / "x.npy")}
    _, rows = load_node_data(context({"partition-id": 2, "num-partitions": 3}, shared))
    assert np.array_equal(rows, X[6:])  # array_split(8, 3) -> 3, 3, 2 rows
    with pytest.raises(ClientDataError, match="no 'partition-id'"):
        load_node_data(context({"data-path": str(tmp_path / "x.npy")}))
    with pytest.raises(ClientDataError, match="client 1: no data"):
        load_node_data(context({"partition-id": 1}))
    with pytest.raises(ClientDataError, match="'num-partitions'"):
        load_node_data(context({"partition-id": 1}, shared))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_node_data(context({"partition-id": 1, "data-path": str(tmp_path / "no.npy")}))


def test_missing_flower_says_what_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['flwr'] = None  # as if flwr were not installed\n"
        "from fednovelty.runtime.flower import load_result, EngineConfig\n"
        "try:\n"
        "    from fednovelty.runtime.flower import make_server_app\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'fednovelty[flower]'" in done.stdout
