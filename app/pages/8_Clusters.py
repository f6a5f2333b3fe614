"""Clusters: synthetic clients in true clusters (and rogue ones) fitted with
ClusteredFedGMMDetector; cluster sizes per round, found vs true clusters, client-level
anomaly scores and the components."""

import streamlit as st
from fednovelty_app import ui

ui.setup("Clusters", ":material/workspaces:")

from dataclasses import astuple  # noqa: E402

from fednovelty_app.clusters import (  # noqa: E402
    CLUSTER_NAMES,
    ROGUE,
    ClusterSpec,
    assignment_table,
    clustered_rounds,
    component_frame,
    new_client_rows,
    row_frame,
    run_clusters,
    sizes_frame,
)
from fednovelty_app.plots import (  # noqa: E402
    client_scores_figure,
    cluster_assignment_figure,
    cluster_scatter,
    cluster_sizes_figure,
)


@st.cache_resource(max_entries=16, show_spinner=False)
def fitted(fields: tuple):
    """The fitted run of ``ClusterSpec(*fields)`` (read-only: scoring never changes it)."""
    return run_clusters(ClusterSpec(*fields))


st.title("Clusters")
st.markdown(
    "Clients in groups: each client's rows are half from a population every client shares "
    "and half from its true cluster's own population; a *rogue* client's own half comes from "
    "a place no cluster holds. `ClusteredFedGMMDetector` fits global components shared by "
    "all clients plus each found cluster's own components, places every client in the "
    "cluster whose mixture fits its rows best (or, with *summary*, by the server's k-means "
    "on the clients' weights), and gives each client a score: a robust z-score of how "
    "badly its rows fit the best cluster (docs/clustered_mixtures.md)."
)
data_col, model_col, show_col = st.columns(3)
n_true = data_col.slider("True clusters", 1, 6, 3, key="clusters_true")
per_cluster = data_col.slider("Clients per true cluster", 1, 8, 4, key="clusters_per")
n_rogue = data_col.slider("Rogue clients", 0, 3, 1, key="clusters_rogue")
n_clusters = model_col.slider("Model's clusters (n_clusters)", 1, 8, 3, key="clusters_k")
cluster_components = model_col.slider(
    "Components per cluster (cluster_components)", 1, 3, 1, key="clusters_cc"
)
n_components = model_col.slider("Global components (n_components)", 1, 3, 1, key="clusters_global")
assignment = show_col.radio(
    "Assignment", ["likelihood", "summary"], horizontal=True, key="clusters_assignment",
    help="likelihood: a client joins the cluster whose mixture fits its rows best (IFCA); "
    "summary: the server k-means-clusters the clients' weights (FeSEM).",
)  # fmt: skip
threshold = show_col.slider(
    "Flag a client whose score exceeds", 1.0, 8.0, 3.0, step=0.5, key="clusters_threshold"
)
seed = show_col.number_input("Seed", 0, 10_000, 0, key="clusters_seed")
spec = ClusterSpec(
    n_true=n_true,
    per_cluster=per_cluster,
    n_rogue=n_rogue,
    n_components=n_components,
    n_clusters=n_clusters,
    cluster_components=cluster_components,
    assignment=assignment,
    seed=int(seed),
)
if spec.n_clusters > spec.n_clients:
    st.error(
        f"The model's {spec.n_clusters} clusters exceed the {spec.n_clients} clients: lower "
        "n_clusters or add clients."
    )
    st.stop()
with st.spinner("Fitting..."):
    run = fitted(astuple(spec))
det, clients = run.detector, run.clients
flagged = clients.score > threshold
last = det.cluster_sizes_history_[-1] if det.cluster_sizes_history_ else []
cols = st.columns(5)
cols[0].metric("Clients", len(clients))
cols[1].metric("Adjusted Rand index", f"{run.ari:.3f}", help="found vs true clusters, rogue "
               "clients left out; 1 = the true clusters exactly")  # fmt: skip
cols[2].metric("Clusters in use", f"{sum(n > 0 for n in last)} of {spec.n_clusters}")
cols[3].metric("Rogue clients flagged", f"{int(flagged[clients.rogue].sum())} of {spec.n_rogue}")
cols[4].metric("Other clients flagged", int(flagged[~clients.rogue].sum()))

top_left, top_right = st.columns(2)
sizes = sizes_frame(det.cluster_sizes_history_, clustered_rounds(det))
top_left.plotly_chart(cluster_sizes_figure(sizes, det.warmup), key="clusters_sizes")
top_right.plotly_chart(
    cluster_assignment_figure(assignment_table(clients, spec.n_clusters), run.ari),
    key="clusters_table",
)
low_left, low_right = st.columns(2)
low_left.plotly_chart(client_scores_figure(clients, threshold), key="clusters_scores")
low_right.plotly_chart(
    cluster_scatter(row_frame(run), component_frame(det), det.covariances_),
    key="clusters_scatter",
)
events = det.cluster_events_
st.caption(
    f"{len(det.cluster_sizes_history_)} clustered rounds after {det.warmup} warm-up rounds; "
    f"empty-cluster events: {len(events) or 'none'}; KB sent up over the run: "
    f"{det.bytes_up_ / 1e3:.1f}. A rogue client trains too: with spare clusters or "
    "components it can get a component of its own, and its score falls."
)
with st.expander("Clients (one row per client)"):
    st.dataframe(clients.assign(flagged=flagged), hide_index=True)

st.subheader("A new client")
sources = [CLUSTER_NAMES[c] for c in range(spec.n_true)] + [ROGUE]
cols = st.columns(4)
source = cols[0].selectbox(
    "Its rows come from", sources, key="clusters_new_source",
    help="a true cluster's population, or the first rogue client's (a place no cluster "
    "holds), each with the shared population; the client did not train.",
)  # fmt: skip
rows = new_client_rows(spec, -1 if source == ROGUE else sources.index(source))
placed = det.adapt(rows)
score = det.client_score(rows)
cols[1].metric("Placed in cluster (adapt)", placed.cluster)
cols[2].metric("Client score (client_score)", f"{score:.2f}")
cols[3].metric("Flagged", "yes" if score > threshold else "no")
