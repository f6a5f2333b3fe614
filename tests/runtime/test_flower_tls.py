"""A secure Flower deployment on loopback: TLS and SuperNode authentication.

The SuperLink serves TLS with a certificate for 127.0.0.1 signed by a CA made here, and runs
with ``--enable-supernode-auth``; two SuperNodes whose public keys were registered with
``flwr supernode register`` hold one partition each, and ``flwr run`` reaches the SuperLink
through a connection that trusts the CA. FedGenGMM (one round) must equal the simulation on
those two partitions to float64 round-off, as on the insecure deployment of
``test_flower_e2e.py`` (whose data and comparisons this module reuses).

Three nodes that should not take part are started before the run, each with the third
partition: one signs with a key that was never registered, one has no key (without
``--enable-supernode-auth`` it would register an ephemeral key of its own and join), one
has a registered key but not the CA (``--root-certificates`` left out). All must be refused
(their processes exit with an error naming why), never show as online, and be absent from
the run's clients. A plain
client without the CA cannot talk to the SuperLink either. The ``openssl`` and ``ssh-keygen``
commands of ``docs/flower.md`` are run as written and must make files Flower accepts.
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from _flower_deployment import APP
from _flower_e2e import (  # same folder: the insecure e2e's data and comparisons
    assert_same_history,
    assert_same_mixture,
    make_partitions,
    simulate,
)
from cryptography.hazmat.primitives import serialization  # a dependency of flwr
from cryptography.hazmat.primitives.asymmetric import ec

from fednovelty import FedGenGMMDetector
from fednovelty.federated import FedGenGMM
from fednovelty.runtime.flower.deploy import LocalFederation, make_certificates, make_node_key

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "flower.md"
#: seconds a refused node may take to give up (a limit, not a budget).
REFUSAL_LIMIT = 180.0


def wait_for_exit(process: subprocess.Popen, limit: float) -> int | None:
    """The exit code of ``process``, or ``None`` if it still runs after ``limit`` seconds."""
    try:
        return process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """Two registered nodes (partitions 0, 1) and three refused ones (partition 2)."""
    work = tmp_path_factory.mktemp("flower_tls")
    X, parts = make_partitions()
    paths = []
    for i, part in enumerate(parts):
        paths.append(work / f"part{i}.npy")
        np.save(paths[-1], part)
    certificates = make_certificates(work / "tls")
    keys = [make_node_key(work / "keys", f"node{i}") for i in range(2)]
    configs = [{"partition-id": i, "data-path": str(paths[i])} for i in range(2)]
    app = work / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    federation = LocalFederation(
        configs, workdir=work / "deployment", certificates=certificates, node_keys=keys
    )
    try:
        federation.start()
        rogue_config = {"partition-id": 2, "data-path": str(paths[2])}
        unregistered = federation.start_node(
            rogue_config, key=make_node_key(work / "keys", "unregistered"), name="unregistered"
        )
        anonymous = federation.start_node(rogue_config, name="anonymous")  # no key at all
        untrusting_key = make_node_key(work / "keys", "untrusting")
        untrusting_id = federation.register_node(untrusting_key)
        untrusting = federation.start_node(
            rogue_config, key=untrusting_key, trust_ca=False, name="untrusting"
        )
        refused = {  # exit codes, once each has had its chance to join (None: still running)
            "unregistered": wait_for_exit(unregistered, REFUSAL_LIMIT),
            "anonymous": wait_for_exit(anonymous, REFUSAL_LIMIT),
            "untrusting": wait_for_exit(untrusting, REFUSAL_LIMIT),
        }
        yield {
            "federation": federation,
            "app": app,
            "X": X,
            "parts": parts,
            "refused": refused,
            "untrusting_id": untrusting_id,
        }
    finally:
        federation.stop()


def test_nodes_without_a_registered_key_or_the_ca_are_refused(secure) -> None:
    federation = secure["federation"]
    exits = secure["refused"]
    assert all(code not in (None, 0) for code in exits.values()), exits  # gave up, failing
    reasons = {  # what each refused node logged before exiting
        "unregistered": "Failed to activate SuperNode",
        "anonymous": "All SuperNodes must be registered",
        "untrusting": "CERTIFICATE_VERIFY_FAILED",
    }
    for name, reason in reasons.items():
        assert reason in (federation.path / f"{name}.log").read_text(errors="replace"), name
    status = federation.node_status()
    assert sorted(status.values()) == ["online", "online", "registered"]
    assert status[secure["untrusting_id"]] == "registered"  # registered, never connected


def test_a_client_without_the_ca_cannot_connect(secure) -> None:
    federation = secure["federation"]
    health = f"{federation.url}/health"
    assert health.startswith("https://127.0.0.1:")
    with urllib.request.urlopen(health, timeout=30, context=federation.ssl_context()) as reply:
        assert reply.status == 200  # with the CA: trusted
    with pytest.raises(urllib.error.URLError) as refused:  # the system's CAs only
        urllib.request.urlopen(health, timeout=30, context=ssl.create_default_context())
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    plain = health.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        urllib.request.urlopen(plain, timeout=30)  # no TLS at all


def test_fedgengmm_over_tls_with_node_auth_equals_simulation(secure) -> None:
    federation, parts, X = secure["federation"], secure["parts"], secure["X"]
    params = {"n_components": 3, "k_range": [1, 4], "samples_per_component": 50}
    result = federation.run_app(
        secure["app"],
        {"algorithm": "FedGenGMM", "algorithm-params": json.dumps(params), "num-nodes": 2},
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(FedGenGMM(**{**params, "k_range": (1, 4)}, random_state=0), parts[:2])
    assert sorted(result.state.client_models) == [0, 1]  # the refused nodes took no part
    for c, model in simulated.state.client_models.items():
        assert_same_mixture(result.state.client_models[c], model)
    assert_same_mixture(result.state.params, simulated.state.params)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []
    on_flower = FedGenGMMDetector.from_model(result, X)
    in_process = FedGenGMMDetector.from_model(simulated, X, n_components=3, k_range=(1, 4))
    # scores cross zero (densities above 1 on scaled features): relative to their scale
    assert_close_scaled(on_flower.decision_scores_, in_process.decision_scores_, rtol=1e-12)


def test_node_keys_need_certificates_and_one_key_per_node(tmp_path) -> None:
    key = make_node_key(tmp_path, "node0")
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation([{"partition-id": 0}], workdir=tmp_path, node_keys=[key])
    certificates = make_certificates(tmp_path / "tls")
    with pytest.raises(ValueError, match="one key pair per node"):
        LocalFederation(
            [{"partition-id": 0}, {"partition-id": 1}],
            workdir=tmp_path,
            certificates=certificates,
            node_keys=[key],
        )


def test_made_certificates_chain_to_the_ca_for_loopback(tmp_path) -> None:
    """The server certificate verifies against the CA for 127.0.0.1 and localhost (checked
    by Python's TLS stack in memory, no socket), and private keys are owner-only."""
    certificates = make_certificates(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certificates.certfile, certificates.keyfile)
    for host in ("127.0.0.1", "localhost"):
        client = ssl.create_default_context(cafile=str(certificates.ca_certfile))
        assert _handshake(client, server, host) is None
    stranger = ssl.create_default_context()  # the system's CAs only
    assert isinstance(_handshake(stranger, server, "127.0.0.1"), ssl.SSLCertVerificationError)
    other = ssl.create_default_context(cafile=str(certificates.ca_certfile))
    assert isinstance(_handshake(other, server, "example.org"), ssl.SSLCertVerificationError)
    for private in (certificates.keyfile, tmp_path / "ca.key"):
        assert private.stat().st_mode & 0o077 == 0
    key = make_node_key(tmp_path, "node0")
    assert key.public_key.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert key.private_key.stat().st_mode & 0o077 == 0


def test_certificates_and_keys_are_never_overwritten(tmp_path) -> None:
    make_certificates(tmp_path)
    key = make_node_key(tmp_path, "node0")
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match=r"ca\.pem exists"):
        make_certificates(tmp_path)
    key.private_key.unlink()  # a half pair: still refused, nothing written
    del before[key.private_key]
    with pytest.raises(FileExistsError, match=r"node0\.pub exists"):
        make_node_key(tmp_path, "node0")
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(ValueError, match="hosts: expected a list"):
        make_certificates(tmp_path / "other", "superlink.example.org")


def documented_block(after: str) -> str:
    """The first ``bash`` block of ``docs/flower.md`` after the line holding ``after``."""
    text = DOCS.read_text()
    start = text.index("```bash\n", text.index(after)) + len("```bash\n")
    return textwrap.dedent(text[start : text.index("```", start)])


@pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
    reason="the documented commands need the openssl and ssh-keygen programs",
)
def test_documented_certificate_and_key_commands_make_what_flower_accepts(tmp_path) -> None:
    """docs/flower.md's openssl and ssh-keygen lines, run as written: the certificate
    verifies against the CA for every name the nodes and the ServerApp dial, and Flower's
    own loader takes the node key."""
    from flwr.cli.supernode.register import try_load_public_key

    script = documented_block("1. **Certificates**") + documented_block("2. **A key pair")
    subprocess.run(["bash", "-euc", script], cwd=tmp_path, check=True, capture_output=True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "certs" / "server.pem", tmp_path / "certs" / "server.key")
    for host in ("superlink.example.org", "203.0.113.10", "127.0.0.1"):
        client = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.pem"))
        assert _handshake(client, server, host) is None, host
    assert len(try_load_public_key(tmp_path / "keys" / "node0.pub")) > 0
    private = serialization.load_ssh_private_key((tmp_path / "keys" / "node0").read_bytes(), None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)  # what flower-supernode requires


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, host: str) -> Exception | None:
    """A TLS handshake between the two contexts over memory BIOs: the client's error, or
    ``None`` once the client has verified the server and finished."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # a handshake takes 2-3 flights
        try:
            c.do_handshake()
            return None
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as error:
            return error
        s_in.write(c_out.read())
        try:
            s.do_handshake()
        except ssl.SSLWantReadError:
            pass
        c_in.write(s_out.read())
    raise AssertionError("the TLS handshake did not finish in 10 flights")
