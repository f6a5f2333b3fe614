"""Scores: log p(x) of inliers and novel rows, ROC / PR curves, a threshold and its counts,
and why one row scores as it does (its component and each feature's share of the distance)."""

import numpy as np
import pandas as pd
import streamlit as st
from fednovelty_app import ui

ui.setup("Scores", ":material/bar_chart:")

from fednovelty_app import conformal  # noqa: E402
from fednovelty_app.analysis import (  # noqa: E402
    confusion_at,
    curves,
    explain_row,
    has_components,
    has_personal_weights,
    metrics_or_none,
    score_axis,
    scored_test_rows,
)
from fednovelty_app.data import tested_words  # noqa: E402
from fednovelty_app.plots import (  # noqa: E402
    p_value_histogram,
    pr_figure,
    roc_figure,
    score_histogram,
    shares_figure,
)

st.title("Scores")
run = ui.require_run(what="the scores")
det, bundle = run.detector, run.bundle
axis, sign = score_axis(det)

POOLED = "pooled (all test rows, global model)"
clients = {}
if has_personal_weights(det) or bundle.groups_test is not None:
    clients = {str(c): c for c in bundle.client_ids}
views = [POOLED, *clients]
view = st.selectbox(
    "Rows and weights",
    views,
    key="scores_view_" + ui.short(run.key),
    format_func=lambda v: v if v == POOLED else f"client {v}",
    help="A client's view: its own test rows where they are known, scored with its own "
    "mixture weights pi_c where the model has them (FedGMM).",
)
client = clients.get(view)
frame = scored_test_rows(det, bundle, client)
known = bool((frame.novel >= 0).all())
st.caption(
    ("All test rows" if client is None else f"Client {view}'s test rows")
    + f": {tested_words(frame.novel)}."
)
result = metrics_or_none(frame.novel, frame.score) if known else None

if result is None:
    why = (
        "these rows hold only one class"
        if known
        else "the data have no novelty labels (choose a novelty column when uploading)"
    )
    st.info(f"No ROC / PR metrics: {why}. The histogram and threshold still work.")
else:
    ui.show_metrics(
        result,
        {
            "auroc": "AUROC",
            "aupr_out": "AUPR (novel)",
            "aupr_in": "AUPR (inlier)",
            "fpr_at_95_tpr": "FPR @ 95 % TPR",
            "max_f1": "Max-F1",
        },
    )

low, high = np.percentile(frame.value, [0.5, 99.5])
low, high = float(min(low, high - 1e-9)), float(high)
start = float(np.clip(sign * float(det.threshold_), low, high))
direction = "below" if sign < 0 else "above"
threshold = st.slider(
    f"Threshold on {axis}: rows {direction} it are flagged as novel",
    low,
    high,
    start,
    key="scores_threshold_" + ui.short(run.key + view),
    help="Starts at the detector's threshold_ (its contamination share of training rows).",
)

st.plotly_chart(
    score_histogram(
        frame,
        axis,
        threshold,
        title=f"{axis} of the test rows" + ("" if client is None else f" of client {view}"),
    ),
    key="scores_histogram",
)
if result is not None:
    c = curves(frame.novel, frame.score)
    left, right = st.columns(2)
    left.plotly_chart(roc_figure(c["fpr"], c["tpr"], result["auroc"]), key="scores_roc")
    right.plotly_chart(
        pr_figure(c["recall"], c["precision"], result["aupr_out"], float(frame.novel.mean())),
        key="scores_pr",
    )

counts = confusion_at(frame.novel, frame.score, sign * threshold)
st.subheader("At this threshold")
cols = st.columns(4)
cols[0].metric("Flagged", f"{counts['flagged']:,} of {len(frame):,}")
if known:
    cols[1].metric("Precision", f"{counts['precision']:.3f}")
    cols[2].metric("Recall (TPR)", f"{counts['recall']:.3f}")
    cols[3].metric("False positive rate", f"{counts['fpr']:.3f}")
    st.dataframe(
        pd.DataFrame(
            {
                "flagged novel": [counts["tp"], counts["fp"]],
                "passed as normal": [counts["fn"], counts["tn"]],
            },
            index=["novel rows", "normal rows"],
        )
    )

if conformal.is_conformal(det):
    st.subheader(f"Conformal alarms (alpha = {float(det.alpha):g})")
    ui.show_threshold_table(conformal.threshold_table(det, bundle))
    p_frame, grid = conformal.view_p_values(det, bundle, client)
    title = "Conformal p-values" + ("" if client is None else f" of client {view}'s test rows")
    figure = p_value_histogram(p_frame, conformal.p_value_edges(grid), float(det.alpha), title)
    st.plotly_chart(figure, key="scores_p_values")
    st.caption(
        "Each row's p-value against its own client's calibration rows (the federation's for "
        "a client without its own, or rows of unknown client). Normal rows should spread "
        "evenly (density near the dotted line); novel rows pile up near 0."
    )

st.subheader("Explain a row")
if not has_components(det):
    st.info(
        f"{run.method.method} has no Gaussian components to explain its scores with; the "
        "mixture detectors (FedGMM, DEM, FedGenGMM, Local, CentralGMM) have."
    )
    st.stop()
order = np.argsort(-frame.score.to_numpy(), kind="stable")
row = st.number_input(
    f"Test row (0-{len(frame) - 1}; starts at the most novel-looking one)",
    min_value=0,
    max_value=len(frame) - 1,
    value=int(order[0]),
    key="scores_row_" + ui.short(run.key + view),
)
why = explain_row(det, bundle, int(row), client)
picked = frame.iloc[int(row)]
cols = st.columns(4)
cols[0].metric(axis, f"{picked.value:.3f}")
cols[1].metric("Component", str(why["component"]))
cols[2].metric("Responsibility", f"{why['responsibility']:.3f}")
cols[3].metric("Squared distance", f"{why['mahalanobis_sq']:.2f}")
st.plotly_chart(
    shares_figure(why["shares"], title=f"Row {row} ({picked.group}): why it is far from "
                  f"component {why['component']}"),
    key="scores_shares",
)  # fmt: skip
st.caption(
    "The component with the highest responsibility for this row, and each feature's share "
    "of the row's squared Mahalanobis distance to it (the shares sum to 1). With correlated "
    "features a share can be negative: that feature's deviation is expected given the others."
)
