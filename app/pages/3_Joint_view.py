"""Joint view (FedGMM): log p(x) against log p(y|x), the FedGMM paper's Figure 2."""

import numpy as np
import streamlit as st
from fednovelty_app import ui

ui.setup("Joint view", ":material/scatter_plot:")

from fednovelty_app.analysis import is_joint, joint_view  # noqa: E402
from fednovelty_app.plots import joint_scatter  # noqa: E402

st.title("Joint view: is the input novel, or its label?")
run = ui.require_run(what="the joint view")
det, bundle = run.detector, run.bundle
if not is_joint(det):
    st.info(
        "The joint view needs FedGMM's joint model p(x, y). On **Train**, choose FedGMM with "
        "'Joint model' on labelled data: the synthetic dataset, or an upload with a class "
        "label column."
    )
    st.stop()
if bundle.novel_test is None or bundle.y_test is None:
    st.info("The test rows need labels and a novelty column for this view.")
    st.stop()

st.markdown(
    "Each point is a test row. **Normal** rows keep their labels; **novel inputs** come from "
    "a distribution no client trained on (covariate novelty: low log p(x)); **permuted "
    "labels** are the normal rows with every class renamed (label novelty: log p(x) is "
    "unchanged, log p(y|x) drops)."
)
st.session_state.setdefault("joint_rows", 1000)
max_rows = st.slider("Points per group at most", 100, 3000, step=100, key="joint_rows")
frame, aurocs = joint_view(det, bundle, max_rows=max_rows, seed=run.data.seed)
ui.show_metrics(
    aurocs,
    {
        "novel inputs by log p(x)": "AUROC novel inputs, log p(x)",
        "permuted labels by log p(y|x)": "AUROC permuted labels, log p(y|x)",
        "novel inputs by log p(y|x)": "AUROC novel inputs, log p(y|x)",
        "permuted labels by log p(x)": "AUROC permuted labels, log p(x)",
    },
)
st.plotly_chart(joint_scatter(frame), key="joint_scatter")
finite = np.isfinite(frame[["log_px", "log_py_given_x"]]).all(axis=1)
st.caption(
    f"{len(frame):,} points ({int((~finite).sum())} with an infinite value not drawn). "
    "AUROCs compare each group with the normal rows; 0.5 = no separation. Labels of novel "
    "inputs are their true labels."
)
