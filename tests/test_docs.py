"""The python examples of README.md and the pages under docs/ really run.

``test_every_python_block_runs`` runs every ```python block of every page, the page's blocks in
order in one fresh namespace, in a temporary working directory; ```bash, ```console and
```text blocks are not run. The other tests check what particular examples print.
"""

import json
import re
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from fednovelty.federated.registry import ALGORITHMS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: a fenced python block, also indented inside a list item (its fence's indent closes it).
PYTHON_BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a markdown text, dedented, in page order."""
    return [textwrap.dedent(match.group(2)) for match in PYTHON_BLOCK.finditer(text)]


#: the pages with python blocks (docs/figures holds benchmark output, not pages of ours).
PAGES = [
    page
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    if "figures" not in page.relative_to(ROOT).parts and python_blocks(page.read_text())
]


def _flower_result(cwd: Path) -> dict[str, str]:
    """docs/flower.md scores a Flower run's result file: write one from a simulated run of the
    same algorithm, and the validation and new rows the example loads."""
    import torch

    from fednovelty.federated import FederatedEM
    from fednovelty.federated.registry import algorithm_name
    from fednovelty.runtime import run_simulation
    from fednovelty.runtime.flower.results import FlowerResult, algorithm_config, save_result

    rng = np.random.default_rng(0)
    clients = [torch.as_tensor(rng.normal(c, 1, (60, 3))) for c in range(3)]
    algorithm = FederatedEM(2, max_iter=5)
    run = run_simulation(algorithm, clients)
    result = FlowerResult(
        state=run.state,
        history=run.history,
        client_states={},
        algorithm=algorithm_name(algorithm),
        config=algorithm_config(algorithm),
    )
    save_result(result, cwd / "result.safetensors")
    np.save(cwd / "validation.npy", torch.cat(clients).numpy())
    np.save(cwd / "new.npy", rng.normal(1, 3, (5, 3)))
    return {"/tmp/fednovelty-result.safetensors": str(cwd / "result.safetensors")}


#: pages whose examples read files a real deployment makes: a function that makes them in the
#: example's working directory and returns the paths to read instead of the documented ones.
PREPARE = {"flower.md": _flower_result}


def _registries() -> list[dict]:
    """The tables a page's example may extend (methods, saved classes, algorithms)."""
    from fednovelty.detectors.persistence import REGISTRY
    from fednovelty.methods import METHODS

    return [METHODS, REGISTRY]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_python_block_runs(page, tmp_path, monkeypatch, capsys):
    blocks = python_blocks(page.read_text())
    monkeypatch.chdir(tmp_path)
    tables = _registries()
    kept = [dict(table) for table in tables]
    algorithms = set(ALGORITHMS)
    try:
        _run_blocks(page, blocks, tmp_path)
    finally:  # what a page registers (e.g. the add-an-algorithm walk) is gone after it
        for table, before in zip(tables, kept, strict=True):
            table.clear()
            table.update(before)
        for name in set(ALGORITHMS) - algorithms:
            ALGORITHMS.remove(name)
    capsys.readouterr()


def _run_blocks(page: Path, blocks: list[str], tmp_path: Path) -> None:
    """Run ``blocks`` of ``page`` in order in one namespace; fail naming the block."""
    replace = PREPARE.get(page.name, lambda cwd: {})(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for number, block in enumerate(blocks, 1):
        for documented, made in replace.items():
            block = block.replace(documented, made)
        where = f"{page.relative_to(ROOT)}, python block {number} of {len(blocks)}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # short fits' ConvergenceWarning and the like
                exec(compile(block, where, "exec"), namespace)
        except Exception as error:
            pytest.fail(f"{where} raised {type(error).__name__}: {error}")


def test_the_block_finder_reads_indented_blocks_and_skips_the_others():
    text = (
        "```bash\nmake test\n```\n\n```python\nx = 1\n```\n\n1. In a list:\n\n"
        "   ```python\n   y = x + 1\n   ```\n\n```text\nout\n```\n"
    )
    assert python_blocks(text) == ["x = 1\n", "y = x + 1\n"]


def test_the_joint_model_example_runs(capsys):
    """docs/usage.md: the joint model's scores, its class prediction and an adapted client."""
    (block,) = [b for b in python_blocks((DOCS / "usage.md").read_text()) if "adapt(" in b]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, "docs/usage.md joint model", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("[") and len(lines) >= 3


def test_benchmarks_page_example_runs(capsys):
    text = (DOCS / "benchmarks.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    exec(compile(block, "docs/benchmarks.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["dataset", "protocol", "method", "auroc", "rounds"]
    assert len(lines) == 1 + 2 * 2 * 3 + 1  # header, 12 cells, summary title
    assert lines[-1] == "# Benchmark summary: auroc (novel = positive class)"


def test_robust_page_examples_run(capsys):
    text = (DOCS / "robust.md").read_text()
    defaults, copula = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(defaults, "docs/robust.md", "exec"), {})
    assert capsys.readouterr().out.split() == ["moments", "1", "True"]
    exec(compile(copula, "docs/robust.md", "exec"), {})
    assert capsys.readouterr().out.split() == ["1", "2", "3", "True"]


def test_benchmarks_page_lists_the_registry(capsys):
    """The Methods table of docs/benchmarks.md names every registered novelty method (variants
    aside) and nothing else, and its registry example runs."""
    from fednovelty.methods import method_names

    text = (DOCS / "benchmarks.md").read_text()
    section = text.split("## Methods", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for row in re.findall(r"^\| (`.*?) \|", section, flags=re.M):
        listed |= set(re.findall(r"`([^`]+)`", row))
    assert listed == set(method_names())
    example = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    exec(compile(example, "docs/benchmarks.md Methods", "exec"), {})
    federated, description = capsys.readouterr().out.strip().splitlines()
    assert "FedGenGMM" in federated and "CentralGMM" not in federated
    assert description


def test_benchmarks_page_femnist_example_runs(capsys):
    text = (DOCS / "benchmarks.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (block,) = [textwrap.dedent(b) for b in blocks if "femnist" in b]  # indented in a list
    exec(compile(block, "docs/benchmarks.md FEMNIST", "exec"), {})
    shape, seen, unseen = capsys.readouterr().out.rsplit(maxsplit=2)
    assert shape.startswith("(") and shape.endswith(", 784)") and (seen, unseen) == ("16", "4")


def test_streaming_page_example_runs(capsys):
    text = (DOCS / "streaming.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    exec(compile(block, "docs/streaming.md", "exec"), {})
    first, *table = capsys.readouterr().out.strip().splitlines()
    window, weights = first.split(" ", 1)
    assert window == "4" and weights == "[0.6, 0.6, 0.6, 0.6]"  # the share of A tracked
    assert table[0].split() == ["window", "client", "total_variation", "surprise", "alarm"]


def test_clustered_page_example_runs(capsys):
    """docs/clustered.md: the Fed-CAM methods on clients with opposite labelling rules print
    what the page shows (the numbers to a tolerance: float32 training on another CPU)."""
    text = (DOCS / "clustered.md").read_text()
    block, shown = re.findall(r"```(?:python)?\n(.*?)```", text, flags=re.S)[:2]
    exec(compile(block, "docs/clustered.md", "exec"), {})

    def table(lines):
        rows = {}
        for line in lines.strip().splitlines():
            name, _, accuracy, _, ari, _, sizes = line.split(maxsplit=6)
            rows[name] = (float(accuracy), float(ari), sizes)
        return rows

    printed, expected = table(capsys.readouterr().out), table(shown)
    assert list(printed) == ["FedAvg+", "IFCA", "FeSEM", "IFCA-CAM", "FeSEM-CAM"]
    for name, (accuracy, ari, _) in expected.items():
        assert abs(printed[name][0] - accuracy) <= 0.02 and abs(printed[name][1] - ari) <= 0.02
    for name in ("FeSEM", "IFCA-CAM", "FeSEM-CAM"):
        assert printed[name][1:] == (1.0, "[3, 3, 3]")


def test_clustered_mixtures_page_example_runs(capsys):
    text = (DOCS / "clustered_mixtures.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    exec(compile(block, "docs/clustered_mixtures.md", "exec"), {})
    clusters, sizes, flags, placed = capsys.readouterr().out.strip().splitlines()
    found = json.loads(clusters)
    assert found[:3] == found[3:6] == found[6:] and len(set(found)) == 3
    assert sizes == "[3, 3, 3]" and flags == "True True" and placed == "True"


def test_variational_page_example_runs(capsys):
    """docs/variational.md: K = 10 pruned to the three blobs, 4 clients = 1 client, the
    predictive and plug-in scores close, save/load scoring identically."""
    text = (DOCS / "variational.md").read_text()
    block, shown = re.findall(r"```(?:python)?\n(.*?)```", text, flags=re.S)[:2]
    exec(compile(block, "docs/variational.md", "exec"), {})
    out = capsys.readouterr().out.strip().splitlines()
    expected = shown.strip().splitlines()
    assert len(out) == len(expected) == 5
    assert [out[i] for i in (0, 1, 2, 4)] == [expected[i] for i in (0, 1, 2, 4)]
    gap, far = out[3].split()
    assert float(gap) < 0.05 and far == "True"  # the gap's last digits vary by CPU


def test_trust_page_example_runs(capsys):
    text = (DOCS / "trust.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(block, "docs/trust.md", "exec"), {})
    assert capsys.readouterr().out.split() == ["True", "0", "False"]


def test_the_add_an_algorithm_walk_names_real_files():
    """Every file the walk names exists (a ``<name>`` placeholder stands for the new one),
    and the walk touches four places."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    paths = set(re.findall(r"`((?:fednovelty|tests|docs)/[\w/<>.]+\.(?:py|md))`", text))
    named = {p for p in paths if "<" not in p}
    assert named and all((ROOT / p).is_file() for p in named), sorted(
        p for p in named if not (ROOT / p).is_file()
    )
    places = re.findall(r"^## \d+\. ", text, flags=re.MULTILINE)
    assert len(places) == 4
