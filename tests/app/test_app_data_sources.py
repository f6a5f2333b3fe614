"""The Train page's data sources that come from files or packages: FEMNIST's writers and
scikit-learn's bundled digits (the default when the data folder is missing)."""

from streamlit.testing.v1 import AppTest

TRAIN = "pages/1_Train.py"


def train_page(app_dir, state: dict) -> AppTest:
    at = AppTest.from_file(str(app_dir / "Home.py"), default_timeout=120)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    at.switch_page(TRAIN).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_femnist_writers_train_with_unseen_writers(app_dir):
    state = {
        "train_source": "femnist",
        "train_fem_writers": 4,
        "train_unseen": 1,
        "train_method": "DEM",
        "train_k": 2,
        "train_rounds": 5,
    }
    at = train_page(app_dir, state)
    source = at.selectbox(key="train_source")
    assert "FEMNIST writers" in source.options  # shown by its label, not the task name
    assert at.slider(key="train_fem_writers").value == 4
    assert not any(r.key == "train_protocol" for r in at.radio)  # writers: novelty only
    at.button(key="do_train").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    run = at.session_state["run"]
    assert set(run.bundle.client_ids.tolist()) == {0, 1, 2, 3}
    assert len(run.bundle.unseen) == 1 and run.bundle.partition_label_name == "writer"
    assert any("FEMNIST writers" in c.value for c in at.caption)


def test_without_the_data_folder_the_page_starts_on_the_bundled_digits(
    app_dir, monkeypatch, tmp_path
):
    monkeypatch.setenv("FEDNOVELTY_DATA", str(tmp_path / "missing"))
    at = train_page(app_dir, {"train_ad_clients": 3, "train_unseen": 1, "train_method": "DEM",
                              "train_k": 2, "train_rounds": 5})  # fmt: skip
    source = at.selectbox(key="train_source")
    assert source.value == "digits" and "FEMNIST writers" not in source.options
    bundled = "scikit-learn digits (bundled, real)"
    assert source.options[:2] == ["FedGMM synthetic (labelled)", bundled]
    at.button(key="do_train").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("bundled handwritten digits" in c.value for c in at.caption)
