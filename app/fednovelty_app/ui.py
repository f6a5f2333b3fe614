"""Streamlit pieces shared by the pages: page set-up, the trained run, the model cache.

Only this module and the page scripts import Streamlit. ``setup`` keeps the Train page's
settings when the user visits other pages (Streamlit forgets the state of widgets that a
page does not draw; re-assigning the values makes them plain session state) and starts
importing torch and fednovelty in the background, so the first page appears at once and the
Train page is ready by the time it is opened.
"""

from __future__ import annotations

import hashlib
import importlib
import threading

import streamlit as st

TRAIN_PREFIX = "train_"
RUN_KEY = "run"
CACHE_SIZE = 8
HEAVY_MODULES = ("fednovelty", "fednovelty_app.training", "fednovelty_app.plots")


def setup(title: str, icon: str = ":material/analytics:") -> None:
    """Page config and the state housekeeping every page does first."""
    st.set_page_config(page_title=f"{title} · fednovelty", page_icon=icon, layout="wide")
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and key.startswith(TRAIN_PREFIX):
            st.session_state[key] = st.session_state[key]
    warm_imports()


@st.cache_resource(show_spinner=False)
def warm_imports() -> threading.Thread:
    """Import the heavy modules once per server process, in a background thread."""

    def work():
        for name in HEAVY_MODULES:
            importlib.import_module(name)

    thread = threading.Thread(target=work, name="fednovelty-warm-imports", daemon=True)
    thread.start()
    return thread


@st.cache_resource(show_spinner=False)
def model_store() -> dict:
    """Trained runs by ``run_key`` (shared by the sessions of this server; newest last)."""
    return {}


def remember(key: str, run) -> None:
    """Keep ``run`` in the model cache under ``key``, dropping the oldest beyond CACHE_SIZE."""
    store = model_store()
    store.pop(key, None)
    store[key] = run
    while len(store) > CACHE_SIZE:
        store.pop(next(iter(store)))


def current_run():
    """The run the pages show (the last trained or uploaded in the user's session), or None."""
    return st.session_state.get(RUN_KEY)


def set_run(run) -> None:
    st.session_state[RUN_KEY] = run


def short(text: str) -> str:
    """A short stable id of ``text`` for widget keys."""
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def require_run(*, what: str = "this page"):
    """The current run, or an explanation with a link to the Train page (and stop)."""
    run = current_run()
    if run is None:
        st.info(f"No model yet: train one (or upload a saved model) to see {what}.")
        st.page_link("pages/1_Train.py", label="Go to Train", icon=":material/model_training:")
        st.stop()
    from fednovelty_app.data import tested_words

    bundle = run.bundle
    st.caption(
        f"Model: **{run.label}** · {bundle.X_train.shape[0]:,} training rows in "
        f"{len(bundle.client_ids)} clients · "
        f"{tested_words(bundle.novel_test, bundle.X_test.shape[0])}"
    )
    return run


def default(key: str, value) -> None:
    """Set a widget's first value through session state (no ``value=`` on the widget)."""
    if key not in st.session_state:
        st.session_state[key] = value


def default_choice(key: str, options: list, value) -> None:
    """Like :func:`default`, and reset a remembered choice that is no longer offered."""
    if st.session_state.get(key) not in options:
        st.session_state[key] = value if value in options else options[0]


def show_metrics(values: dict[str, float], names: dict[str, str]) -> None:
    """One ``st.metric`` per entry of ``names`` (key -> label), side by side."""
    columns = st.columns(len(names))
    for column, (key, label) in zip(columns, names.items(), strict=True):
        value = values.get(key)
        column.metric(label, "n/a" if value is None else f"{value:.3f}")


def show_threshold_table(table) -> None:
    """The conformal threshold table (``conformal.threshold_table``) with rates to 3
    decimals, and what its columns mean."""
    rate = st.column_config.NumberColumn(format="%.3f")
    st.dataframe(
        table,
        hide_index=True,
        column_config={
            "threshold": st.column_config.NumberColumn(format="%.4g"),
            **{name: rate for name in ("false-alarm rate", "95 % low", "95 % high", "alpha")},
        },
    )
    st.caption(
        "Each client raises an alarm when a row's score exceeds its own threshold, set from "
        "its held-out calibration rows (source 'own'; 'federation': too few rows, it takes the "
        "federation's). The false-alarm rate is the share of its normal test rows, which "
        "never trained nor calibrated, that its threshold flags, with an exact 95 % binomial "
        "interval; conformal calibration promises at most alpha per client. The last row is "
        "the federation's threshold (predict without a client) on all normal test rows."
    )
