"""Unseen client: adapt the mixture weights to a client held out of training; with conformal
alarms, its false-alarm rate under the federation's threshold and after ``calibrate``."""

import streamlit as st
from fednovelty_app import ui

ui.setup("Unseen client", ":material/person_add:")

from fednovelty_app.analysis import adaptation, is_joint  # noqa: E402
from fednovelty_app.conformal import is_conformal, unseen_alarms  # noqa: E402
from fednovelty_app.plots import adaptation_figure  # noqa: E402

st.title("Unseen client")
run = ui.require_run(what="adaptation to an unseen client")
det, bundle = run.detector, run.bundle
if not bundle.unseen:
    st.info("No client was held out. On **Train**, set 'Clients held out of training' > 0.")
    st.stop()
ids = {str(u.client_id): u for u in bundle.unseen}
choice = st.selectbox("Held-out client", list(ids), format_func=lambda c: f"client {c}")
client = ids[choice]
available = client.X_adapt.shape[0]

if not hasattr(det, "adapt"):
    st.info(
        f"{run.method.method} cannot adapt to a new client. Train FedGMM or DEM: their "
        "Gaussians are shared, so a new client only re-estimates its mixture weights."
    )
elif available < 2:
    st.warning(f"Client {choice} has {available} row(s) for adaptation; at least 2 are needed.")
else:
    st.markdown(
        "A client that never took part in training re-estimates only its mixture weights "
        "`pi` by EM on a few of its rows, all shared Gaussians (and learners) frozen. "
        "*Before* = the global weights a new client gets by default; *after* = its adapted "
        "weights. Both are scored on the client's other rows plus the test set's novel rows."
    )
    n = st.slider(
        "Rows adaptation may use",
        2,
        available,
        min(50, available),
        key="unseen_rows_" + ui.short(run.key + choice),
    )
    use_labels = False
    if is_joint(det) and client.y_adapt is not None:
        use_labels = st.checkbox("Use their labels (else x-only EM)", value=True)
    result = adaptation(det, bundle, client.client_id, n, use_labels=use_labels)

    cols = st.columns(4)
    cols[0].metric("AUROC before", f"{result.auroc_before:.3f}")
    cols[1].metric(
        "AUROC after",
        f"{result.auroc_after:.3f}",
        delta=f"{result.auroc_after - result.auroc_before:+.3f}",
    )
    if is_joint(det):
        cols[2].metric("Accuracy before", f"{result.accuracy_before:.3f}")
        cols[3].metric(
            "Accuracy after",
            f"{result.accuracy_after:.3f}",
            delta=f"{result.accuracy_after - result.accuracy_before:+.3f}",
        )
    st.plotly_chart(adaptation_figure(result.trace), key="unseen_trace")
    st.caption(
        f"{result.n_samples} rows{' with labels' if result.labelled else ''}; EM "
        f"{'converged' if result.converged else 'stopped'} after {result.n_iter} "
        "iteration(s). Iteration 0 is the global weights."
    )

normal = available + int((client.novel_eval == 0).sum())
if is_conformal(det) and normal >= 2:
    st.subheader(f"Conformal alarms (alpha = {float(det.alpha):g})")
    n_cal = st.slider(
        "Rows calibrate uses (its first normal rows; the rest measure the rates)",
        1,
        normal - 1,
        min(50, normal - 1),
        key="unseen_calibrate_" + ui.short(run.key + choice),
    )
    alarms = unseen_alarms(det, bundle, client.client_id, n_cal)
    cols = st.columns(4)
    cols[0].metric("False-alarm rate before", f"{alarms.false_alarm_before:.3f}")
    cols[1].metric(
        "False-alarm rate after",
        f"{alarms.false_alarm_after:.3f}",
        delta=f"{alarms.false_alarm_after - alarms.false_alarm_before:+.3f}",
        delta_color="inverse",
    )
    cols[2].metric("Novel rows flagged before", f"{alarms.detected_before:.3f}")
    cols[3].metric("Novel rows flagged after", f"{alarms.detected_after:.3f}")
    st.caption(
        f"Before: the federation's threshold ({alarms.threshold_before:.4g}), which holds for "
        "the training clients' rows, not for a new client's. After: calibrate(X, client) "
        f"with its first {alarms.n_calibration} normal rows sets its own threshold "
        f"({alarms.threshold_after:.4g}, shrunk towards the federation's: an estimate, so "
        f"the rate is measured, not promised). Rates on its other {alarms.n_normal} normal "
        f"rows and {alarms.n_novel} novel rows; alpha = {alarms.alpha:g}. The trained model "
        "is not changed."
    )
