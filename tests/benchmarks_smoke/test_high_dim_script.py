"""Smoke test of ``benchmarks/high_dim.py`` (every mixture family through the federated PCA
front end against KNN on 512-feature embeddings): the quick run (one MVTec-AD set, two
families, 4 clients) writes its CSV and report, and a second run resumes from the CSV."""

import pandas as pd


def test_quick_run_writes_the_csv_and_the_report_and_resumes(benchmark_script, tmp_path):
    module = benchmark_script("high_dim")
    csv, out = tmp_path / "high_dim.csv", tmp_path / "high_dim.md"
    argv = ["--quick", "--csv", str(csv), "--out", str(out)]
    report = module.main(argv)
    frame = pd.read_csv(csv)
    assert list(frame.columns) == module.COLUMNS
    assert frame.family.tolist() == ["KNN", "DEM-kmeans", "FedVB"]
    assert frame.variant.tolist() == ["knn", "front", "front"]
    assert (frame.d == 512).all() and frame.dataset.eq("MVTec-AD_bottle").all()
    fronts = frame[frame.variant == "front"]
    assert ((fronts.q >= 1) & (fronts.q < 512)).all()  # "auto" projected the 512 features
    assert frame.auroc.between(0.5, 1.0).all() and (frame.seconds > 0).all()
    assert out.read_text() == report
    for family in ("DEM-kmeans", "FedVB"):
        assert f"| MVTec-AD_bottle | {frame.n_train[0]} | 512 |" in report
        assert f"| {family} |" in report
    again = module.main(argv)  # every row is in the CSV already: nothing is refitted
    assert pd.read_csv(csv).equals(frame)
    assert again.split("## Per set")[1] == report.split("## Per set")[1]
