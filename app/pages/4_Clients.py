"""Clients: the partition, mixture weights pi_c, per-client AUROC, conformal thresholds,
rounds and bytes."""

import streamlit as st
from fednovelty_app import ui

ui.setup("Clients", ":material/hub:")

from fednovelty_app.analysis import (  # noqa: E402
    has_personal_weights,
    history_frame,
    metrics_or_none,
    novelty_scores,
    partition_table,
    per_client_auroc,
)
from fednovelty_app.conformal import is_conformal, threshold_table  # noqa: E402
from fednovelty_app.plots import (  # noqa: E402
    client_auroc_figure,
    partition_dot_plot,
    rounds_figure,
    weights_heatmap,
)

st.title("Clients")
run = ui.require_run(what="the clients")
det, bundle = run.detector, run.bundle

st.subheader("Partition")
counts, ids, values = partition_table(bundle)
unseen = [u.client_id for u in bundle.unseen]
st.plotly_chart(
    partition_dot_plot(counts, ids, values, bundle.partition_label_name, unseen),
    key="clients_partition",
)
st.caption(f"Dot size = rows of that {bundle.partition_label_name} on that client. "
           + bundle.description)  # fmt: skip

left, right = st.columns(2, gap="large")
with left:
    st.subheader("Mixture weights")
    if has_personal_weights(det) and len(det.client_weights_) == len(bundle.client_ids):
        st.plotly_chart(
            weights_heatmap(det.client_weights_, det.client_ids_), key="clients_weights"
        )
    else:
        st.info(
            f"{run.method.method} has no per-client mixture weights (FedGMM has: pi_c per "
            "client, shared Gaussians)."
        )
with right:
    st.subheader("AUROC per client")
    table = per_client_auroc(det, bundle)
    if table is None:
        st.info(
            "Every client would show the same number: this model has no per-client weights "
            "and the test rows have no client ids (or the data have no novelty labels)."
        )
    else:
        pooled = None
        if bundle.novel_test is not None:
            result = metrics_or_none(
                bundle.novel_test, novelty_scores(det, bundle.frame(bundle.X_test))
            )
            pooled = None if result is None else result["auroc"]
        st.plotly_chart(client_auroc_figure(table, pooled), key="clients_auroc")
        missing = table.client[table.auroc.isna()].tolist()
        st.caption(
            ("Own test rows" if bundle.groups_test is not None else "The pooled test rows")
            + (", scored with each client's pi_c." if table.weights.eq("own pi_c").all() else ".")
            + (f" No bar for client(s) {', '.join(missing)}: their rows hold one class only."
               if missing else "")
        )  # fmt: skip

if is_conformal(det):
    st.subheader(f"Alarm thresholds per client (conformal, alpha = {float(det.alpha):g})")
    ui.show_threshold_table(threshold_table(det, bundle))

st.subheader("Communication")
history = history_frame(det)
if history is None:
    st.info(f"{run.method.method} is trained on pooled rows: no rounds, no bytes.")
else:
    cols = st.columns(3)
    cols[0].metric("Rounds", len(history))
    cols[1].metric("MB up", f"{history.bytes_up.sum() / 1e6:.3f}")
    cols[2].metric("MB down", f"{history.bytes_down.sum() / 1e6:.3f}")
    st.plotly_chart(rounds_figure(history), key="clients_rounds")
    with st.expander("Round table"):
        st.dataframe(history, hide_index=True)
