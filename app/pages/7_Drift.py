"""Drift: a stream of clients whose mix moves, fitted window by window; per-client weights,
surprise and alarms."""

import streamlit as st
from fednovelty_app import ui

ui.setup("Drift", ":material/timeline:")

from fednovelty_app.drift import StreamSpec, run_stream  # noqa: E402
from fednovelty_app.plots import alarms_figure, tracking_figure  # noqa: E402

st.title("Drift")
st.markdown(
    "Clients whose data mix two populations, A and B, in shares that move over time. "
    "`StreamingFedGMMDetector` learns window by window (`partial_fit`): each client "
    "re-estimates its own mixture weights with the Gaussians frozen (nothing sent), one "
    "federated round refreshes the Gaussians from summed statistics with forgetting `rho`, "
    "and a CUSUM on each window's surprise raises alarms at the false-alarm rate you set "
    "(docs/streaming.md)."
)
left, right = st.columns(2)
kind = left.selectbox("Schedule of A's share", ["cosine", "linear", "constant"], key="drift_kind")
cycles = left.slider("Cycles", 1, 3, 1, key="drift_cycles")
n_windows = left.slider("Windows", 5, 60, 30, key="drift_windows")
n_clients = left.slider("Clients", 1, 12, 6, key="drift_clients")
rho = right.slider("Forgetting rho", 0.0, 1.0, 0.8, step=0.05, key="drift_rho")
rounds = right.slider("Federated rounds per window (0: weights only)", 0, 3, 1, key="drift_rounds")
rate = right.select_slider(
    "False-alarm rate per window", [0.001, 0.005, 0.01, 0.05], value=0.01, key="drift_rate"
)
jump = right.checkbox("Population B jumps to a new place half-way", key="drift_jump")
spec = StreamSpec(
    kind=kind,
    cycles=cycles,
    n_windows=n_windows,
    n_clients=n_clients,
    rho=rho,
    rounds=rounds,
    false_alarm_rate=rate,
    jump_at=n_windows // 2 if jump else None,
)
bar = st.progress(0.0, text="windows")
run = run_stream(
    spec, progress=lambda done, total: bar.progress(done / total, text=f"window {done} of {total}")
)
bar.empty()
det = run.detector
cols = st.columns(4)
cols[0].metric("Windows", det.window_)
cols[1].metric("Mean |pi - true share|", f"{abs(run.learned - run.truth)[1:].mean():.3f}")
scored = run.drift[run.drift["status"] == "ok"]
cols[2].metric("Client alarms", int(scored["alarm"].sum()))
cols[3].metric("Global alarms", len(det.global_alarms_))
st.plotly_chart(tracking_figure(run.truth, run.learned, det.client_ids_), key="drift_tracking")
st.plotly_chart(alarms_figure(run.drift), key="drift_alarms")
births = sorted({w for w, b in zip(run.drift["window"], run.drift["births"], strict=True) if b})
st.caption(
    f"Global alarms in windows {det.global_alarms_ or 'none'}; components re-born in windows "
    f"{births or 'none'}. KB sent up over the stream: {det.total_bytes_up_ / 1e3:.1f}."
)
with st.expander("Drift table (one row per client and window)"):
    st.dataframe(run.drift.drop(columns=["births"]), hide_index=True)
