"""The algorithm layer in two parts: ``federated/core`` (messages, declarations, steps,
settings, wire, aggregation) imports nothing from ``federated/trust`` (gates, floors, DP,
ledger, noise, robust aggregation, secure sums), neither imports a family, no modules of
``federated`` import each other in a circle, and no family module reads a client's policy,
ledger or noise source: a step sees only its ``ReleaseTerms``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import fednovelty
from fednovelty.federated import FederatedEM
from fednovelty.federated.core.base import ClientContext, ReleaseTerms
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy

PACKAGE = Path(fednovelty.__file__).parent
FEDERATED = PACKAGE / "federated"
#: names a family module may not use: the client's policy, ledger and noise machinery.
TRUST_INTERNALS = frozenset(
    {
        "PrivacyPolicy",
        "DPPolicy",
        "PrivacyLedger",
        "ClientTerms",
        "release_noise",
        "noise_source",
        "SeededNoise",
        "SystemNoise",
        "terms_of",
    }
)
#: attributes a family module may not read: the policy and ledger behind a client's terms.
TRUST_ATTRIBUTES = frozenset({"policy", "ledger"})


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every ``fednovelty`` module ``path`` imports, at any depth of its code."""
    found: set[str] = set()
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else None
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fednovelty"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join([*(package or "").split(".")[: 1 - node.level or None], base])
            if not base.startswith("fednovelty"):
                continue
            for alias in node.names:  # "from pkg import module" imports the module
                candidate = f"{base}.{alias.name}"
                known = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py")
                package_dir = PACKAGE.parent / candidate.replace(".", "/")
                found.add(candidate if known.exists() or package_dir.is_dir() else base)
    return found


def modules(where: Path) -> dict[str, Path]:
    return {module_name(p): p for p in sorted(where.rglob("*.py"))}


ALL = modules(FEDERATED)
CORE = {m for m in ALL if m.startswith("fednovelty.federated.core")}
TRUST = {m for m in ALL if m.startswith("fednovelty.federated.trust")}
FAMILIES = {
    m
    for m in ALL
    if m not in CORE | TRUST and m not in {"fednovelty.federated", "fednovelty.federated.registry"}
}


def offending_imports(names: set[str], allowed_prefixes: tuple[str, ...]) -> dict[str, list]:
    bad = {}
    for name in sorted(names):
        wrong = sorted(
            m
            for m in imported(ALL[name])
            if m.startswith("fednovelty.federated") and not m.startswith(allowed_prefixes)
        )
        if wrong:
            bad[name] = wrong
    return bad


def test_federated_shows_its_two_parts() -> None:
    assert {"core", "trust"} <= {p.name for p in FEDERATED.iterdir() if p.is_dir()}
    assert len(CORE) >= 7 and len(TRUST) >= 12


def test_the_core_imports_nothing_from_the_trust_layer_or_a_family() -> None:
    assert offending_imports(CORE, ("fednovelty.federated.core",)) == {}


def test_the_trust_layer_imports_the_core_and_itself_only() -> None:
    allowed = ("fednovelty.federated.core", "fednovelty.federated.trust")
    assert offending_imports(TRUST, allowed) == {}


def test_the_contract_check_can_fail() -> None:
    """The check sees function-level and ``from package import module`` imports."""
    source = "def f():\n    from fednovelty.federated.trust import dp\n"
    path = FEDERATED / "core" / "_probe_contract.py"
    path.write_text(source)
    try:
        assert "fednovelty.federated.trust.dp" in imported(path)
    finally:
        path.unlink()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_of_the_algorithm_layer_import_each_other_in_a_circle() -> None:
    """The package's ``__init__`` (exports) and the registry (which walks every module) sit
    above the rest and are left out; every other module's imports form no circle."""
    inner = set(ALL) - {"fednovelty.federated", "fednovelty.federated.registry"}
    graph = {name: {m for m in imported(ALL[name]) if m in inner} for name in inner}
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def policy_reads(source: str) -> list[str]:
    """Where ``source`` reads a client's policy, ledger or noise machinery."""
    reads = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in TRUST_ATTRIBUTES:
            reads.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in TRUST_INTERNALS:
            reads.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom):
            reads += [f"{node.lineno}: {a.name}" for a in node.names if a.name in TRUST_INTERNALS]
    return reads


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_family_module_reads_the_clients_policy(name: str) -> None:
    assert policy_reads(ALL[name].read_text()) == []


def test_the_policy_read_check_can_fail() -> None:
    probe = (
        "from fednovelty.federated.trust.dp import release_noise\n"
        "def client_step(X, message, context):\n"
        "    if context.policy.dp is not None:\n"
        "        return context.terms.ledger\n"
    )
    assert len(policy_reads(probe)) == 3


def test_a_step_sees_terms_not_the_policy() -> None:
    """The terms a step reads carry the floor and, under DP, the mechanism's public
    constants; the default is the unprotected protocol."""
    policy = PrivacyPolicy(min_rows=7, dp=DPPolicy(2.0, 3.0, "local", epsilon=1.0))
    terms = gate.client_context(0, policy=policy).terms
    assert (terms.floor, terms.min_rows) == (1, 7)  # under DP the noise replaces the floor
    assert terms.private.noise_multiplier == 2.0 and terms.private.clip_norm == 3.0
    assert not hasattr(terms.private, "epsilon") and not hasattr(terms.private, "ledger")
    plain = gate.client_context(0, policy=PrivacyPolicy(min_rows=7)).terms
    assert (plain.floor, plain.private) == (7, None)
    bare = ReleaseTerms()
    assert (bare.floor, bare.private, bare.releases(1)) == (1, None, True)


def test_the_gate_floors_what_a_step_computes() -> None:
    """A component of two rows: the step computes its statistics; only the gate (which
    every engine calls) sends them as zeros below a floor of five."""
    X = torch.cat([torch.zeros(20, 2), torch.full((2, 2), 50.0)]).double()
    algorithm = FederatedEM(2, init_params="kmeans", random_state=0)
    means = torch.tensor([[0.0, 0.0], [50.0, 50.0]], dtype=torch.float64)
    state, unfloored = algorithm.start(), _context(min_rows=1)
    while state.phase != "em":
        state = algorithm.server_step(
            state, {0: gate.answer(algorithm, X, algorithm.configure(state), unfloored)}
        )[0]
    message = algorithm.configure(state)
    message.tensors["means"] = means
    raw = algorithm.client_step(X, message, ClientContext(0))
    released = gate.answer(algorithm, X, message, _context())
    assert float(raw.tensors["counts"].min()) > 1.5
    assert float(released.tensors["counts"].min()) == 0.0


def _context(min_rows: int = 5) -> ClientContext:
    return gate.client_context(0, policy=PrivacyPolicy(min_rows=min_rows))
