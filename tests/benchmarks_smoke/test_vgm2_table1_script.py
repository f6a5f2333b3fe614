"""Smoke test of ``benchmarks/vgm2_table1.py``: the quick run on MNIST writes the table of
every variant, the bytes arithmetic and the tidy files; ``--encoder convnet`` runs the
ConvNet; finished cells are kept and read back by a rerun under the same settings only."""

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
    assert all(r["encoder"] == "mlp" for r in records)
    assert "an MLP encoder 784 -> 128 -> 16" in report
    assert len(list((tmp_path / "cells").glob("MNIST-*-seed0.pkl"))) == len(module.VARIANTS)


def test_convnet_cells_are_kept_and_read_back_under_the_same_settings(
    benchmark_script, tmp_path, capsys
):
    module = benchmark_script("vgm2_table1")
    argv = ["--quick", "--datasets", "mnist", "--encoder", "convnet", "--out-dir", str(tmp_path)]
    argv += ["--variants", "VGM2", "FedAvg"]
    report = module.main(argv)
    assert "a ConvNet encoder (5x5 convolutions" in report
    first = json.loads((tmp_path / "vgm2_table1.json").read_text())
    assert [r["encoder"] for r in first] == ["convnet", "convnet"]
    assert all(0 <= r["macro_f1"] <= 1 for r in first)
    assert by_name_bytes(first)["VGM2"] == 128
    assert by_name_bytes(first)["FedAvg"] > 100_000  # the ConvNet and head: ~80k float32
    cells = sorted(p.name for p in (tmp_path / "cells").glob("*.pkl"))
    assert cells == ["MNIST-FedAvg-seed0.pkl", "MNIST-VGM2-seed0.pkl"]
    assert "0 units read back, 2 computed" in report
    capsys.readouterr()

    again = module.main(argv)  # every cell read back: no fit, the first run's seconds
    log = capsys.readouterr().out
    assert "resumed MNIST-VGM2-seed0" in log and "resumed MNIST-FedAvg-seed0" in log
    assert "2 units read back, 0 computed" in again
    assert json.loads((tmp_path / "vgm2_table1.json").read_text()) == first
    assert (
        again.split("## MNIST")[1].split("## Kept")[0]
        == (report.split("## MNIST")[1].split("## Kept")[0])
    )

    argv[argv.index("convnet")] = "mlp"  # other settings, same cells: computed again
    other = module.main(argv)
    assert "other settings; computing it again" in capsys.readouterr().out
    assert "0 units read back, 2 computed" in other
    assert [r["encoder"] for r in json.loads((tmp_path / "vgm2_table1.json").read_text())] == [
        "mlp",
        "mlp",
    ]


def by_name_bytes(records: list[dict]) -> dict[str, float]:
    return {r["variant"]: r["bytes_per_client_round"] for r in records}


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
