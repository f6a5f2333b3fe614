"""Smoke test of ``benchmarks/poisoning.py``: the quick run completes, prints its table and
writes the CSV and the markdown summary; ``off`` really runs without reply validation."""

import pandas as pd


def test_quick_run_prints_and_writes_the_tables(benchmark_script, tmp_path, capsys):
    df = benchmark_script("poisoning").main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out

    header = next(line for line in out.splitlines() if line.lstrip().startswith("dataset"))
    for column in (
        "dataset",
        "algorithm",
        "attack",
        "n_attackers",
        "defence",
        "AUROC",
        "planted AUROC",
        "dropped",
        "seconds",
    ):
        assert column in header
    written = pd.read_csv(tmp_path / "poisoning.csv", keep_default_na=False)
    assert len(written) == len(df)
    assert set(written["attack"]) == {"none", "absent", "non-psd", "tiny-precision"}
    assert set(written["algorithm"]) == {"FederatedEM", "FedGenGMM"}
    fedgen = set(written.loc[written["algorithm"] == "FedGenGMM", "defence"])
    assert {"off", "validation", "cap", "trimmed 0.1", "trimmed 0.2", "median"} <= fedgen

    summary = (tmp_path / "poisoning.md").read_text()
    assert "## FederatedEM" in summary and "## FedGenGMM" in summary
    assert "| attack | attackers | no attack | attackers absent | off | validation | cap |" in (
        summary
    )

    # 'off' swaps the engine's validation out: the non-PSD reply reaches the M-step and
    # stops the fit; with validation it is dropped and the fit goes on
    psd = df[(df["attack"] == "non-psd") & (df["algorithm"] == "FederatedEM")]
    off = psd[psd["defence"] == "off"].iloc[0]
    on = psd[psd["defence"] == "validation"].iloc[0]
    assert off["error"].startswith("SingularCovarianceError")
    assert on["error"] == "" and on["dropped"] > 0 and 0.0 <= on["auroc"] <= 1.0
    # honest federations lose no reply to the validation
    assert (df.loc[df["attack"] == "none", "dropped"] == 0).all()


def test_quick_families_run_writes_the_per_family_table(benchmark_script, tmp_path, capsys):
    df = benchmark_script("poisoning").main(["--families", "--quick", "--out", str(tmp_path)])
    assert "| family | attack | liar absent | sum | trimmed | median |" in capsys.readouterr().out
    written = pd.read_csv(tmp_path / "poisoning_families.csv", keep_default_na=False)
    assert len(written) == len(df) and set(written["family"]) == {"FederatedVB", "ClusteredFL"}
    assert "## " not in (tmp_path / "poisoning_families.md").read_text()  # one table
    # the liar takes the plain sum and not the robust options
    scaled = df[df["attack"] == "scale-1e10"].set_index(["family", "aggregation"])["score"]
    absent = df[df["attack"] == "absent"].set_index("family")["score"]
    for family in ("FederatedVB", "ClusteredFL"):
        assert scaled[family, "sum"] < absent[family] - 0.3
        assert scaled[family, "trimmed"] >= absent[family] - 0.02
