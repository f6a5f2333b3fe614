"""partition_dot_plot: the FedGenGMM paper's Figure 1 dot plot, headless (Agg)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fednovelty.datasets.partition import (
    dirichlet_partition,
    partition_counts,
    partition_dot_plot,
    quantity_partition,
)

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
plt = pytest.importorskip("matplotlib.pyplot")
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402

GROUPS = np.repeat(np.arange(10), 100)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_dot_plot_one_dot_per_nonzero_cell():
    parts = dirichlet_partition(GROUPS, 12, 0.3, random_state=0)
    counts, _ = partition_counts(parts, GROUPS)
    ax = partition_dot_plot(parts, GROUPS, title="Dir(0.3)")
    assert isinstance(ax, Axes)
    assert len(ax.collections) == 1 and isinstance(ax.collections[0], PathCollection)
    dots = ax.collections[0]
    offsets = np.asarray(dots.get_offsets())
    assert offsets.shape == (np.count_nonzero(counts), 2)
    # x = client, y = group; area proportional to the cell's count, largest = max_area
    client, group = offsets[:, 0].astype(int), offsets[:, 1].astype(int)
    cells = counts[client, group]
    assert (cells > 0).all()
    np.testing.assert_allclose(dots.get_sizes(), cells / counts.max() * 300.0)
    assert ax.get_title() == "Dir(0.3)"
    assert ax.get_xlabel() == "client" and ax.get_ylabel() == "group"
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(g) for g in range(10)]


def test_dot_plot_on_given_axes_with_names(tmp_path):
    labels = np.array(["cat", "dog", "emu"])[np.repeat([0, 1, 2], 20)]
    parts = quantity_partition(labels, 4, 1, random_state=0)
    fig, (left, right) = plt.subplots(1, 2)
    ax = partition_dot_plot(parts, labels, ax=right, group_names=["Cat", "Dog", "Emu"])
    assert ax is right and not left.collections
    assert len(ax.collections) == 1 and len(ax.collections[0].get_offsets()) == 4  # k = 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["Cat", "Dog", "Emu"]
    assert ax.get_title() == ""
    path = tmp_path / "partition.png"
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dot_plot_saves_png_and_handles_empty_clients(tmp_path):
    parts = [np.arange(0, 150), np.empty(0, np.int64), np.arange(150, 1000)]
    ax = partition_dot_plot(parts, GROUPS, max_area=50.0)
    assert len(ax.collections[0].get_offsets()) == 2 + 9  # client 0: 2 groups; client 2: 9
    assert np.asarray(ax.collections[0].get_sizes()).max() == pytest.approx(50.0)
    path = tmp_path / "dots.png"
    ax.figure.savefig(path, dpi=50)
    assert path.stat().st_size > 0
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_dot_plot_errors():
    parts = dirichlet_partition(GROUPS, 3, 1.0, random_state=0)
    with pytest.raises(ValueError, match=r"group_names has 2 entries but groups has 10 distinct"):
        partition_dot_plot(parts, GROUPS, group_names=["a", "b"])
    with pytest.raises(ValueError, match=r"max_area must be a finite number > 0; got 0"):
        partition_dot_plot(parts, GROUPS, max_area=0)
    with pytest.raises(ValueError, match=r"parts\[0\] must be a 1-D array of integer row indices"):
        partition_dot_plot([[5000]], GROUPS)


def test_matplotlib_is_imported_lazily():
    code = (
        "import sys, fednovelty.datasets, fednovelty.datasets.partition.plot; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at import time'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
