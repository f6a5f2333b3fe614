"""Smoke test of ``benchmarks/vgm2_table1.py``: the quick run on MNIST writes the table of
every variant, the bytes arithmetic and the tidy files."""

import json


def test_quick_run_writes_table_and_files(benchmark_script, tmp_path):
    module = benchmark_script("vgm2_table1")
    report = module.main(["--quick", "--datasets", "mnist", "--out-dir", str(tmp_path)])
    assert (tmp_path / "vgm2_table1.md").read_text() == report
    assert "## MNIST" in report and "120 bytes" in report
    for name in module.VARIANTS:
        assert report.count(f"| {name} |") == 1
    records = json.loads((tmp_path / "vgm2_table1.json").read_text())
    assert len(records) == len(module.VARIANTS)
    by_name = {r["variant"]: r for r in records}
    assert by_name["VGM2"]["bytes_per_client_round"] == 128
    assert by_name["VGM2, K = 1"]["bytes_per_client_round"] == 48
    assert all(0 <= r["macro_f1"] <= 1 for r in records)
    rows = (tmp_path / "vgm2_table1.csv").read_text().splitlines()
    assert rows[0].startswith("dataset,variant,seed,macro_f1") and len(rows) == 1 + 8


def test_paper_numbers_and_settings(benchmark_script):
    module = benchmark_script("vgm2_table1")
    assert module.PAPER_MNIST == {
        "Local": 0.703,
        "FedAvg": 0.871,
        "Prototype sharing": 0.842,
        "VGM2": 0.909,
    }
    args = module.parse_args([])
    assert (args.clients, args.rounds, args.per_round, args.epochs, args.seeds) == (
        30,
        100,
        2,
        8,
        3,
    )
