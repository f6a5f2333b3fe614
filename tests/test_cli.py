"""The ``fednovelty`` command: fit and score on files, and the demo on a small real dataset."""

import numpy as np
import pandas as pd

from fednovelty import load
from fednovelty.cli import main
from fednovelty.demo import format_table, run_demo


def _table(tmp_path, rng):
    X = np.vstack([rng.normal(0, 1, (300, 3)), rng.normal(5, 1, (300, 3))])
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    frame["site"] = rng.choice(["north", "south", "east"], len(frame))
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    return path


def test_fit_then_score(tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = _table(tmp_path, rng)
    model = tmp_path / "model.safetensors"
    assert main(["fit", str(data), "--client-column", "site", "--components", "2",
                 "--out", str(model)]) == 0  # fmt: skip
    detector = load(model)
    assert detector.n_clients_ == 3 and detector.n_components_ == 2
    scores = tmp_path / "scores.csv"
    assert main(["score", str(model), str(data), "--client-column", "site",
                 "--out", str(scores)]) == 0  # fmt: skip
    out = pd.read_csv(scores)
    assert list(out.columns) == ["log_px", "anomaly_score", "is_anomaly"]
    np.testing.assert_allclose(out.anomaly_score, -out.log_px)
    assert out.is_anomaly.sum() > 0


def test_bad_input_gives_a_message_not_a_traceback(tmp_path, capsys):
    rng = np.random.default_rng(1)
    data = _table(tmp_path, rng)
    code = main(["fit", str(data), "--client-column", "site", "--components", "5000",
                 "--out", str(tmp_path / "m.safetensors")])  # fmt: skip
    assert code == 2
    assert "--components 5000" in capsys.readouterr().err
    assert main(["score", str(tmp_path / "missing.safetensors"), str(data), "--out", "x"]) == 2


def test_demo_runs_on_a_small_real_dataset():
    table = run_demo("14_glass", n_clients=3, n_components=2, progress=False)
    assert list(table.method)[-2:] == ["CentralGMM (pooled data)", "IForest (pooled data, PyOD)"]
    assert table.AUROC.between(0, 1).all()
    assert (table.rounds[:4] >= 1).all() and (table.rounds[4:] == 0).all()
    # on glass, centralized EM detects the anomalies better than chance
    assert table.set_index("method").AUROC["CentralGMM (pooled data)"] > 0.6
    assert "AUROC" in format_table(table)
