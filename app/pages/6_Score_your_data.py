"""Score your data: upload rows, get log p(x), log p(y|x), the flag and the component; a
conformal model adds each row's p-value and its alarm by its client's threshold."""

import numpy as np
import pandas as pd
import streamlit as st
from fednovelty_app import ui

ui.setup("Score your data", ":material/upload_file:")

from fednovelty_app.analysis import score_axis, score_rows  # noqa: E402
from fednovelty_app.conformal import is_conformal, row_alarms  # noqa: E402
from fednovelty_app.plots import score_histogram  # noqa: E402
from fednovelty_app.uploads import UploadError, check_score_table, read_table  # noqa: E402

NONE = "(none)"


def example_rows(bundle, n: int = 200) -> bytes:
    """The first ``n`` test rows as CSV, with client and label columns where known."""
    frame = bundle.frame(bundle.X_test[:n])
    if bundle.groups_test is not None:
        frame["client"] = bundle.groups_test[:n]
    if bundle.y_test is not None:
        frame["label"] = bundle.y_test[:n]
    return frame.to_csv(index=False).encode()


st.title("Score your data")
run = ui.require_run(what="scores of your rows")
det, bundle = run.detector, run.bundle
names = getattr(det, "feature_names_in_", None)
names = None if names is None else [str(c) for c in names]
expected = ", ".join(names[:8]) + (" ..." if names and len(names) > 8 else "") if names else ""
st.markdown(
    "Upload rows with the model's feature columns"
    + (f" (`{expected}`)" if expected else "")
    + ", optionally a client column (its personal weights are used) and a label column "
    "(adds log p(y|x) for joint models)."
)
st.download_button(
    "Example file: 200 test rows of the current data",
    example_rows(bundle),
    file_name="example_rows.csv",
    mime="text/csv",
)
uploaded = st.file_uploader("Rows to score", type=["csv", "parquet"], key="score_file")
if uploaded is None:
    st.stop()
try:
    frame = read_table(uploaded.name, uploaded.getvalue())
except UploadError as error:
    st.error(str(error))
    st.stop()

columns = list(frame.columns)
spare = [NONE, *[c for c in columns if names is None or str(c) not in names]]
left, right = st.columns(2)
default_client = "client" if "client" in spare else NONE
default_label = "label" if "label" in spare else NONE
client_col = left.selectbox("Client column", spare, index=spare.index(default_client))
label_col = right.selectbox("Label column", spare, index=spare.index(default_label))
try:
    X, clients, labels = check_score_table(
        frame,
        names,
        int(det.n_features_in_),
        client_column=None if client_col == NONE else client_col,
        label_column=None if label_col == NONE else label_col,
    )
except UploadError as error:
    st.error(str(error))
    st.stop()

axis, sign = score_axis(det)
base = sign * float(det.threshold_)
preview, _ = score_rows(det, X)
values = sign * preview.anomaly_score.to_numpy()
low = float(min(np.min(values), base))
high = float(max(np.max(values), base))
high = high if high > low else low + 1.0
direction = "below" if sign < 0 else "above"
threshold = st.slider(
    f"Flag rows with {axis} {direction}",
    low,
    high,
    base,
    key="score_threshold_" + ui.short(run.key + uploaded.name),
    help="Starts at the detector's threshold_.",
)
try:
    table, notes = score_rows(det, X, clients=clients, labels=labels, threshold=sign * threshold)
except ValueError as error:  # e.g. labels of another type than the model's classes
    st.error(str(error))
    st.stop()
conformal = is_conformal(det)
if conformal:
    alarms, more = row_alarms(det, X, clients)
    table, notes = pd.concat([table, alarms], axis=1), [*notes, *more]
for note in notes:
    st.caption(note)

cols = st.columns(4 if conformal else 3)
cols[0].metric("Rows", f"{len(table):,}")
cols[1].metric("Flagged as novel", f"{int(table.flag.sum()):,}")
cols[2].metric("Share flagged", f"{table.flag.mean():.1%}")
if conformal:
    cols[3].metric(f"Conformal alarms (alpha {float(det.alpha):g})", f"{int(table.alarm.sum()):,}")
    st.caption(
        "p_value: the row's conformal p-value (small = unlike its client's calibration rows); "
        "alarm: 1 when its score exceeds its client's own threshold (the federation's for a "
        "row without a client or of a client without one), whatever the slider says."
    )
shown = pd.DataFrame(
    {"value": sign * table.anomaly_score, "group": np.where(table.flag == 1, "novel", "normal")}
)
st.plotly_chart(
    score_histogram(shown, axis, threshold, title=f"{axis} of your rows (colour = flag)"),
    key="score_histogram",
)
result = pd.concat([frame.reset_index(drop=True), table], axis=1)
st.dataframe(result, hide_index=True)
st.download_button(
    "Download scores (CSV)",
    result.to_csv(index=False).encode(),
    file_name=f"scores_{uploaded.name.rsplit('.', 1)[0]}.csv",
    mime="text/csv",
    type="primary",
)
