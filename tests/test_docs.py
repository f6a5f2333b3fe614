"""The python examples of the pages under docs/ really run."""

import json
import re
import textwrap
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


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
