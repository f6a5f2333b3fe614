"""fednovelty dashboard: the first page (``fednovelty app``, which binds 127.0.0.1; docs/app.md).

It imports Streamlit only; torch and fednovelty load in a background thread while the user
reads it (see ``fednovelty_app.ui.setup``).
"""

import streamlit as st
from fednovelty_app import ui

ui.setup("Home", ":material/home:")

st.title("fednovelty dashboard")
st.markdown(
    "Federated novelty detection with Gaussian mixtures: train a detector across simulated "
    "clients, see how well its scores separate normal from novel rows, look inside the "
    "clients, adapt to a client that never trained, and score your own rows. Data stay on "
    "their clients during training; only sufficient statistics or model parameters travel."
)

PAGES = [
    ("pages/1_Train.py", "Train", ":material/model_training:",
     "pick data (synthetic, ADBench or your file), a client partition and a method; "
     "watch the rounds; download or upload the model."),
    ("pages/2_Scores.py", "Scores", ":material/bar_chart:",
     "log p(x) of inliers and novel rows, ROC and PR curves, a threshold and its counts."),
    ("pages/3_Joint_view.py", "Joint view", ":material/scatter_plot:",
     "FedGMM's log p(x) against log p(y|x): novel inputs vs permuted labels."),
    ("pages/4_Clients.py", "Clients", ":material/hub:",
     "the partition, each client's mixture weights and AUROC, bytes per round."),
    ("pages/5_Unseen_client.py", "Unseen client", ":material/person_add:",
     "adapt the mixture weights to a held-out client from a few of its rows."),
    ("pages/6_Score_your_data.py", "Score your data", ":material/upload_file:",
     "upload rows and download their scores, flags and components."),
    ("pages/7_Drift.py", "Drift", ":material/timeline:",
     "a stream whose client mix moves: per-client weights, surprise and drift alarms."),
    ("pages/8_Clusters.py", "Clusters", ":material/workspaces:",
     "clients in clusters: sizes per round, found vs true clusters, client-level scores."),
]  # fmt: skip

for path, label, icon, text in PAGES:
    left, right = st.columns([1, 4])
    with left:
        st.page_link(path, label=label, icon=icon)
    right.write(text)

run = ui.current_run()
if run is None:
    st.info("No model yet. Start on **Train**: its defaults train FedGMM's joint model on "
            "the FedGMM paper's synthetic clients in about ten seconds.")  # fmt: skip
else:
    st.success(f"Current model: {run.label}.")
