"""Train: data, partition and method; per-round progress; cached per settings; model files."""

import streamlit as st
from fednovelty_app import ui

ui.setup("Train", ":material/model_training:")

from fednovelty_app.data import (  # noqa: E402  (after the page config, as Streamlit wants)
    FEMNIST,
    FEMNIST_WRITERS,
    SYNTHETIC,
    UploadError,
    adbench_names,
    default_source,
    digest,
    read_table,
    source_label,
)
from fednovelty_app.holdout import (  # noqa: E402
    held_out_choice,
    one_client_message,
    split_clients,
    table_client_ids,
)
from fednovelty_app.training import (  # noqa: E402
    DataSettings,
    MethodSettings,
    ModelFileError,
    build_bundle,
    calibrates,
    centralized_choices,
    choice_method,
    counts_rounds,
    federated_choices,
    method_description,
    model_from_bytes,
    model_to_bytes,
    run_key,
    train,
    uploaded_run,
)

UPLOAD = "Upload a CSV / Parquet file"
CALIBRATION_LABELS = {"contamination": "PyOD contamination", "conformal": "conformal"}
P = ui.TRAIN_PREFIX
NONE = "(none)"


@st.cache_resource(max_entries=8, show_spinner="Preparing the data ...")
def cached_bundle(settings: DataSettings, _frame=None):
    """The data of ``settings`` (uploads are keyed by their content hash in ``settings``)."""
    return build_bundle(settings, _frame)


@st.cache_data(max_entries=4, show_spinner=False)
def cached_table(name: str, content: bytes):
    return read_table(name, content)


def guess_client_column(columns: list) -> str:
    for column in columns:
        if str(column).lower() in ("client", "client_id", "site", "group", "device", "node"):
            return column
    return columns[0]


st.title("Train")
st.caption(
    "Choose data, how it is split into clients, and a detector. Runs are cached per "
    "settings: training again with the same settings is instant."
)

data_col, method_col = st.columns(2, gap="large")
frame = None
upload_key = None
upload_ids = None  # the uploaded table's client ids (sorted), once a client column is chosen
with data_col:
    st.subheader("Data and clients")
    sources = [SYNTHETIC, *adbench_names(), UPLOAD]
    ui.default_choice(P + "source", sources, default_source())
    source = st.selectbox(
        "Dataset",
        sources,
        key=P + "source",
        format_func=source_label,
        help="The FedGMM paper's synthetic clients (labelled: every page works), "
        "scikit-learn's bundled handwritten digits (real, no data folder needed), FEMNIST's "
        "writers as clients or an ADBench dataset from the shared data folder, or your own "
        "table.",
    )
    extra: dict = {}
    if source == SYNTHETIC:
        ui.default(P + "syn_clients", 10)
        ui.default(P + "syn_alpha", 0.4)
        ui.default(P + "syn_features", 8)
        extra["n_clients"] = st.slider("Training clients", 2, 40, key=P + "syn_clients")
        extra["alpha"] = st.number_input(
            "Dirichlet alpha of the clients' component weights",
            0.05,
            100.0,
            step=0.1,
            key=P + "syn_alpha",
            help="Smaller = each client sees fewer components (more heterogeneous).",
        )
        extra["n_features"] = st.slider("Features (d)", 2, 32, key=P + "syn_features")
    elif source == UPLOAD:
        uploaded = st.file_uploader(
            "Table with one row per sample", type=["csv", "parquet"], key="upload_data_file"
        )
        if uploaded is None:
            st.info("Upload a file with a client column and numeric feature columns.")
        else:
            content = uploaded.getvalue()
            try:
                frame = cached_table(uploaded.name, content)
            except UploadError as error:
                st.error(str(error))
            else:
                columns = list(frame.columns)
                upload_key = digest(content)
                ui.default_choice(P + "client_col", columns, guess_client_column(columns))
                ui.default_choice(P + "label_col", [NONE, *columns], NONE)
                ui.default_choice(P + "novel_col", [NONE, *columns], NONE)
                extra["client_column"] = st.selectbox(
                    "Client column", columns, key=P + "client_col"
                )
                upload_ids = table_client_ids(frame, extra["client_column"])
                label = st.selectbox(
                    "Class label column (optional: FedGMM's joint model)",
                    [NONE, *columns],
                    key=P + "label_col",
                )
                novel = st.selectbox(
                    "Novelty column (optional: 1 = novel, kept out of training)",
                    [NONE, *columns],
                    key=P + "novel_col",
                )
                extra["label_column"] = None if label == NONE else label
                extra["novel_column"] = None if novel == NONE else novel
                extra["upload_digest"] = upload_key
                extra["upload_name"] = uploaded.name
                st.dataframe(frame.head(5), hide_index=True)
    elif source == FEMNIST:
        ui.default(P + "fem_writers", FEMNIST_WRITERS)
        extra["n_clients"] = st.slider(
            "Training writers (each writer a client)",
            2,
            200,
            key=P + "fem_writers",
            help="A seeded choice of FEMNIST's 539 writers; more writers train longer. Half "
            "of the writers' test images are rotated, mirrored or scaled: the novel inputs.",
        )
    else:
        ui.default(P + "protocol", "novelty")
        ui.default(P + "partition", "dirichlet")
        ui.default(P + "ad_clients", 10)
        ui.default(P + "ad_alpha", 0.5)
        ui.default(P + "max_train", 20_000)
        extra["protocol"] = st.radio(
            "Protocol",
            ["novelty", "outlier"],
            key=P + "protocol",
            horizontal=True,
            help="novelty: train on inliers, test held-out inliers + anomalies; outlier: "
            "train on a contaminated 70 %, test the other 30 %.",
        )
        extra["partition"] = st.selectbox(
            "Partition", ["dirichlet", "quantity", "iid"], key=P + "partition"
        )
        extra["n_clients"] = st.slider("Training clients", 2, 50, key=P + "ad_clients")
        extra["alpha"] = st.number_input(
            "alpha (Dirichlet concentration; quantity: clusters per client)",
            0.05,
            100.0,
            step=0.1,
            key=P + "ad_alpha",
        )
        extra["max_train"] = int(
            st.number_input("At most this many training rows", 100, 300_000, key=P + "max_train")
        )
    # Held-out clients: drawn on top of the training clients, except for an upload, whose
    # clients are what they are (at least 2 must train). The default follows the data chosen.
    held_max, held_default = held_out_choice(None if upload_ids is None else upload_ids.size)
    held_for = (source, upload_key, extra.get("client_column"))
    if P + "unseen_for" in st.session_state and st.session_state[P + "unseen_for"] != held_for:
        st.session_state[P + "unseen"] = held_default
    st.session_state[P + "unseen_for"] = held_for
    ui.default(P + "unseen", held_default)
    st.session_state[P + "unseen"] = min(int(st.session_state[P + "unseen"]), held_max)
    ui.default(P + "seed", 0)
    extra["n_unseen"] = int(
        st.number_input(
            "Clients held out of training (Unseen client page)",
            0,
            held_max,
            key=P + "unseen",
            disabled=held_max == 0,
            help="Held-out clients never train; the Unseen client page adapts to them. "
            + (
                "They are drawn on top of the training clients."
                if upload_ids is None
                else "An uploaded table's held-out clients are its last ones (sorted ids), "
                "and at least 2 of its clients must train."
            ),
        )
    )
    if upload_ids is not None:
        train_ids, held_ids = split_clients(upload_ids, extra["n_unseen"])
        st.caption(
            f"Column {extra['client_column']!r} holds {upload_ids.size} client(s): "
            f"{train_ids.size} train, {held_ids.size} held out"
            + ("" if held_max else " (too few clients to hold one out and train on 2)")
            + "."
        )
        message = one_client_message(train_ids, held_ids)
        if message is not None:
            st.warning(message, icon=":material/warning:")
    extra["seed"] = int(st.number_input("Seed", 0, 10_000, key=P + "seed"))

with method_col:
    st.subheader("Method")
    federated = federated_choices()
    methods = [*federated, *centralized_choices()]
    ui.default_choice(P + "method", methods, "FedGMM")
    method = st.selectbox(
        "Detector",
        methods,
        key=P + "method",
        format_func=lambda m: m if m in federated else f"{m} (centralized baseline)",
    )
    options: dict = {"method": method}
    takes = choice_method(method).shared  # the registry's shared settings this method takes
    if "n_components" in takes:
        ui.default(P + "k", 3)
        options["n_components"] = st.slider("Gaussian components (K)", 1, 20, key=P + "k")
    if "covariance_type" in takes:
        ui.default_choice(P + "cov", ["full", "diag", "tied", "spherical"], "full")
        options["covariance_type"] = st.selectbox(
            "Covariance type", ["full", "diag", "tied", "spherical"], key=P + "cov"
        )
    if counts_rounds(method):
        ui.default(P + "rounds", 30)
        options["max_iter"] = st.slider("EM rounds at most", 5, 200, key=P + "rounds")
    if method == "DEM":
        inits = ["kmeans", "separated", "subset", "oneshot"]
        ui.default_choice(P + "init", inits, "kmeans")
        options["init_params"] = st.selectbox(
            "Initialisation",
            inits,
            key=P + "init",
            help="subset pools 100 raw rows on the server (not private); oneshot starts "
            "from one round of local fits and accelerates the EM rounds (fewer rounds).",
        )
    if method == "FedGMM":
        ui.default(P + "joint", True)
        ui.default(P + "learners", 3)
        ui.default(P + "epochs", 5)
        options["joint"] = st.checkbox(
            "Joint model p(x, y) when the data have labels",
            key=P + "joint",
            help="Adds log p(y|x) (the Joint view) and label accuracy (Unseen client).",
        )
        if options["joint"]:
            options["n_learners"] = st.slider("Learners (M2)", 1, 5, key=P + "learners")
            options["local_epochs"] = st.slider("Local epochs per round", 1, 10, key=P + "epochs")
    if "client_components" in takes:
        ui.default_choice(P + "kc", ["BIC", *range(1, 11)], "BIC")
        kc = st.selectbox("Components per client (K_c)", ["BIC", *range(1, 11)], key=P + "kc")
        options["client_components"] = None if kc == "BIC" else int(kc)
    if method == "FedGenGMM":
        ui.default(P + "copula", False)
        options["copula"] = st.checkbox(
            "Score with a Gaussian copula",
            key=P + "copula",
            help="The server also fits a 1-D mixture per feature and a mixture of their normal "
            "scores on its synthetic rows (same round, no extra communication); scores use it. "
            "Better on average over 25 ADBench sets (docs/robust.md); the components shown "
            "stay those of the plain global mixture.",
        )
    if calibrates(method):
        ui.default_choice(P + "calibration", list(CALIBRATION_LABELS), "contamination")
        ui.default(P + "alpha", 0.01)
        options["calibration"] = st.radio(
            "Alarm calibration",
            list(CALIBRATION_LABELS),
            key=P + "calibration",
            format_func=CALIBRATION_LABELS.get,
            horizontal=True,
            help="PyOD contamination: the threshold flags the training rows' top share, no "
            "promised false-alarm rate. Conformal: each client holds out 20 % of its rows "
            "and keeps its own threshold, so a new normal row of that client raises an alarm "
            "with probability at most alpha (Scores and Clients show the rates achieved).",
        )
        if options["calibration"] == "conformal":
            options["alpha"] = st.number_input(
                "alpha (false-alarm rate per client)",
                0.001,
                0.5,
                step=0.005,
                format="%.3f",
                key=P + "alpha",
                help="A client needs ceil(1 / alpha) - 1 held-out rows for a threshold of its "
                "own (alpha 0.01: 99, about 495 rows of a client); others take the "
                "federation's, with a warning naming them.",
            )
    pooled = "" if method in federated else "; fitted on the pooled rows: no federation, no rounds"
    joint = "; with labels, the joint model p(x, y)" if options.get("joint") else ""
    st.caption(method_description(MethodSettings(**options)) + pooled + joint)

data_settings = DataSettings(source="upload" if source == UPLOAD else source, **extra)
method_settings = MethodSettings(**options)
ready = source != UPLOAD or upload_key is not None


def data_or_error():
    """The bundle, or an error message on the page (and None)."""
    try:
        return cached_bundle(data_settings, frame)
    except (UploadError, ValueError, FileNotFoundError) as error:
        st.error(str(error))
    return None


if st.button("Train", type="primary", disabled=not ready, key="do_train"):
    bundle = data_or_error()
    key = run_key(data_settings, method_settings)
    if bundle is not None and key in ui.model_store():
        ui.set_run(ui.model_store()[key])
        st.success("Loaded from the cache: trained earlier with the same settings.")
    elif bundle is not None:
        bar = st.progress(0.0, text="starting ...")
        try:
            run = train(
                data_settings,
                method_settings,
                bundle,
                on_progress=lambda p: bar.progress(p.fraction, text=p.text()),
            )
        except Exception as error:  # a message, never a traceback
            bar.empty()
            st.error(f"Training failed: {error}")
        else:
            ui.remember(key, run)
            ui.set_run(run)

run = ui.current_run()
if run is not None:
    st.divider()
    st.subheader(f"Current model: {run.label}")
    st.caption(run.bundle.description)
    from fednovelty_app.analysis import metrics_or_none, novelty_scores

    det = run.detector
    bundle = run.bundle
    scores = novelty_scores(det, bundle.frame(bundle.X_test))
    result = metrics_or_none(bundle.novel_test, scores) if bundle.novel_test is not None else None
    cols = st.columns(5)
    cols[0].metric("Test AUROC", "n/a" if result is None else f"{result['auroc']:.3f}")
    cols[1].metric("Rounds", getattr(det, "n_rounds_", 0))
    cols[2].metric("MB up", f"{getattr(det, 'bytes_up_', 0) / 1e6:.3f}")
    cols[3].metric("MB down", f"{getattr(det, 'bytes_down_', 0) / 1e6:.3f}")
    cols[4].metric("Fit seconds", f"{run.fit_seconds:.1f}")
    if bundle.one_client is not None:
        st.warning(bundle.one_client, icon=":material/warning:")
    for message in run.warnings[:3]:
        st.warning(message)
    if getattr(det, "calibration", None) == "conformal":
        st.caption(
            f"Conformal alarms at alpha = {float(det.alpha):g}: each client's threshold and "
            "the false-alarm rate it achieves are on the Scores and Clients pages."
        )
    st.page_link("pages/2_Scores.py", label="See the scores", icon=":material/bar_chart:")

st.divider()
st.subheader("Model file")
down, up = st.columns(2, gap="large")
with down:
    if run is None:
        st.caption("Train a model to download it.")
    else:
        try:
            content = model_to_bytes(run.detector)
        except ModelFileError as error:
            st.caption(str(error))
        else:
            st.download_button(
                "Download model (.safetensors)",
                content,
                file_name=f"fednovelty-{run.method.method.replace(' ', '_')}.safetensors",
                mime="application/octet-stream",
                help="safetensors + JSON metadata: loading runs no code (fednovelty.load).",
            )
with up:
    model_file = st.file_uploader(
        "Upload a saved model (.safetensors), used with the data chosen above",
        type=["safetensors"],
        key="upload_model_file",
    )
    if model_file is not None and st.button("Use the uploaded model", disabled=not ready):
        bundle = data_or_error()
        if bundle is not None:
            content = model_file.getvalue()
            try:
                detector = model_from_bytes(content)
                ui.set_run(uploaded_run(detector, data_settings, bundle, digest(content)))
            except ModelFileError as error:
                st.error(str(error))
            else:
                st.rerun()
