"""The Clusters page: its helpers (app/fednovelty_app/clusters.py), its figures and the page
driven by Streamlit's AppTest."""

import numpy as np
import pandas as pd
import pytest
from fednovelty_app.clusters import (
    ClusterSpec,
    assignment_table,
    client_frame,
    cluster_ari,
    clustered_rounds,
    component_frame,
    new_client_rows,
    rogue_places,
    row_frame,
    run_clusters,
    sizes_frame,
    synthetic_clients,
    true_places,
)
from fednovelty_app.plots import (
    COLORS,
    client_scores_figure,
    cluster_assignment_figure,
    cluster_color,
    cluster_scatter,
    cluster_sizes_figure,
)
from streamlit.testing.v1 import AppTest


@pytest.fixture(scope="module")
def run():
    """The page's default federation: 3 true clusters of 4 clients and 1 rogue client."""
    return run_clusters(ClusterSpec())


def test_clients_sit_in_their_true_clusters_and_rogues_elsewhere():
    spec = ClusterSpec(n_true=3, per_cluster=2, n_rogue=2, rows=40)
    X, groups, truth = synthetic_clients(spec)
    assert X.shape == (8 * 40, 2) and np.bincount(groups).tolist() == [40] * 8
    assert truth.tolist() == [0, 0, 1, 1, 2, 2, -1, -1]
    places, rogues = true_places(3), rogue_places(3, 2)
    np.testing.assert_allclose(np.linalg.norm(places, axis=1), 6.0)
    gaps = np.linalg.norm(rogues[:, None] - places[None], axis=2)
    assert gaps.min() > 5.9 and np.linalg.norm(rogues[0] - rogues[1]) > 5.9  # no cluster's
    own = X[groups == 6][20:]  # the second half of a client's rows is its own population's
    np.testing.assert_allclose(own.mean(axis=0), rogues[0], atol=0.6)
    assert len(rogue_places(2, 3)) == 3 and len(np.unique(rogue_places(2, 3), axis=0)) == 3
    with pytest.raises(ValueError, match="at most 8"):
        synthetic_clients(ClusterSpec(n_true=9))


def test_well_separated_clusters_are_found_and_the_rogue_scores_highest(run):
    det, clients = run.detector, run.clients
    assert run.ari == 1.0
    assert clients.client.tolist() == list(range(13)) and clients.rogue.sum() == 1
    rogue = clients.score[clients.rogue].to_numpy()
    assert rogue.min() > clients.score[~clients.rogue].max() and rogue.min() > 3.0
    for sizes in det.cluster_sizes_history_:  # every client is in one cluster every round
        assert sum(sizes) == run.spec.n_clients == 13
    sizes = sizes_frame(det.cluster_sizes_history_, clustered_rounds(det))
    assert sizes.groupby("round").clients.sum().eq(13).all()
    assert sizes["round"].min() > det.warmup  # communication rounds, after the warm-up


def test_a_new_client_is_placed_in_its_cluster_and_a_rogue_one_flagged(run):
    det, clients = run.detector, run.clients
    for source in range(run.spec.n_true):
        placed = det.adapt(new_client_rows(run.spec, source))
        members = clients.found_cluster[clients.true_cluster == "ABC"[source]]
        assert (members == placed.cluster).all()
        assert det.client_score(new_client_rows(run.spec, source)) < 3.0
    assert det.client_score(new_client_rows(run.spec, -1)) > 3.0


def test_ari_leaves_rogues_out_and_ignores_cluster_names():
    truth = np.array([0, 0, 1, 1, -1])
    assert cluster_ari(truth, np.array([1, 1, 0, 0, 0])) == 1.0
    assert cluster_ari(truth, np.array([1, 1, 0, 0, 1])) == 1.0  # the rogue does not count
    assert cluster_ari(truth, np.array([0, 0, 0, 0, 1])) == 0.0  # collapse
    assert cluster_ari(np.array([0, -1]), np.array([0, 0])) == 1.0


def test_assignment_table_counts_every_client_once():
    clients = pd.DataFrame(
        {
            "client": range(6),
            "true_cluster": ["A", "A", "B", "B", "rogue", "B"],
            "rogue": [False, False, False, False, True, False],
            "found_cluster": [1, 1, 0, 0, 0, -1],
            "score": np.zeros(6),
        }
    )
    table = assignment_table(clients, n_clusters=3)
    assert table.index.tolist() == ["A", "B", "rogue"]
    assert table.columns.tolist() == [0, 1, 2, -1]  # -1: a client that never replied
    assert table.to_numpy().tolist() == [[0, 2, 0, 0], [2, 0, 0, 1], [1, 0, 0, 0]]
    assert table.to_numpy().sum() == 6
    assert assignment_table(clients[clients.found_cluster >= 0], 2).columns.tolist() == [0, 1]


def test_sizes_frame_rounds_and_a_bad_length():
    frame = sizes_frame([[2, 1], [3, 0]], rounds=[11, 12])
    assert frame["round"].tolist() == [11, 11, 12, 12]
    assert frame.cluster.tolist() == ["0", "1", "0", "1"]
    assert frame.clients.tolist() == [2, 1, 3, 0]
    assert sizes_frame([[1]])["round"].tolist() == [1]
    with pytest.raises(ValueError, match="1 round numbers for 2 rounds"):
        sizes_frame([[1], [1]], rounds=[1])


def test_frames_of_a_run(run):
    det = run.detector
    comps = component_frame(det)
    assert len(comps) == det.n_components + det.n_clusters * det.cluster_components
    assert (comps.kind == "global").sum() == det.n_components
    assert set(comps.kind) - {"global"} == {f"cluster {j}" for j in range(det.n_clusters)}
    np.testing.assert_array_equal(comps[["x", "y"]].to_numpy(), det.means_)
    rows = row_frame(run)
    assert len(rows) == len(run.X) and rows.rogue.sum() == run.spec.rows
    first = run.clients.found_cluster.iloc[0]
    assert (rows.found_cluster[rows.client == 0] == str(first)).all()
    assert client_frame(det, np.r_[np.zeros(12, int), -1]).true_cluster.iloc[-1] == "rogue"


def test_cluster_figures(run):
    det, clients = run.detector, run.clients
    sizes = sizes_frame(det.cluster_sizes_history_, clustered_rounds(det))
    fig = cluster_sizes_figure(sizes, det.warmup)
    assert [t.name for t in fig.data] == ["0", "1", "2"]
    assert "10 warm-up" in fig.layout.xaxis.title.text
    assert fig.data[1].line.color == cluster_color(1) and cluster_color(-1) == COLORS["unknown"]
    heat = cluster_assignment_figure(assignment_table(clients, 3), run.ari)
    assert "adjusted Rand index 1.000" in heat.layout.title.text
    assert list(heat.data[0].y) == ["A", "B", "C", "rogue"]
    bars = client_scores_figure(clients, threshold=3.0)
    assert {t.name: t.marker.color for t in bars.data} == {
        "normal": COLORS["normal"],
        "rogue": COLORS["novel"],
    }
    assert bars.layout.shapes[0].y0 == 3.0
    scatter = cluster_scatter(row_frame(run), component_frame(det), det.covariances_)
    names = [t.name for t in scatter.data if t.name]
    assert "global component" in names and "cluster 0 component" in names
    assert any("rogue" in n for n in names)
    means = next(t for t in scatter.data if t.name == "global component")
    assert means.marker.symbol == "diamond"
    ellipses = [t for t in scatter.data if t.mode == "lines"]
    assert len(ellipses) == len(det.means_)


# ------------------------------------------------------------------ the page (AppTest)
def page(app_dir) -> AppTest:
    at = AppTest.from_file(str(app_dir / "Home.py"), default_timeout=120).run()
    at.switch_page("pages/8_Clusters.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def test_the_page_shows_clusters_and_flags_the_rogue(app_dir):
    at = page(app_dir)
    assert len(at.get("plotly_chart")) == 4
    shown = metrics(at)
    assert shown["Clients"] == "13" and shown["Adjusted Rand index"] == "1.000"
    assert shown["Rogue clients flagged"] == "1 of 1" and shown["Other clients flagged"] == "0"
    assert shown["Placed in cluster (adapt)"] is not None
    at.selectbox(key="clusters_new_source").set_value("rogue").run()
    assert metrics(at)["Flagged"] == "yes"

    at.slider(key="clusters_true").set_value(4).run()  # a new federation: refitted
    assert not at.exception, [e.value for e in at.exception]
    shown = metrics(at)
    assert shown["Clients"] == "17" and float(shown["Adjusted Rand index"]) < 1.0  # 3 for 4
    at.slider(key="clusters_k").set_value(4).run()
    assert metrics(at)["Adjusted Rand index"] == "1.000"
    assert metrics(at)["Clusters in use"] == "4 of 4"
    assert len(at.get("plotly_chart")) == 4


def test_the_page_refuses_more_clusters_than_clients(app_dir):
    at = page(app_dir)
    at.slider(key="clusters_true").set_value(1).run()
    at.slider(key="clusters_per").set_value(2).run()
    at.slider(key="clusters_rogue").set_value(0).run()
    at.slider(key="clusters_k").set_value(3).run()
    assert not at.exception
    assert "exceed the 2 clients" in at.error[0].value
    assert len(at.get("plotly_chart")) == 0
