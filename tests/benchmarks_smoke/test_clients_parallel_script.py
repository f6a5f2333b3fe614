"""Smoke test of ``benchmarks/clients_parallel.py``: the quick run times both paths and
finds them giving the same learners and accuracy; the femnist script's presets
(``device_checks.py``'s tests: ``test_device_checks_script.py``)."""


def test_quick_run_compares_both_paths(benchmark_script):
    report = benchmark_script("clients_parallel").main(["--quick"])
    assert "- device: cpu; scale: 8 writers, 1 rounds" in report
    rows = [line for line in report.splitlines() if line.startswith("| alone")]
    assert len(rows) == 1  # quick: alone, one thread
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "1" and float(cells[2]) > 0 and float(cells[3]) > 0
    one, batched = (float(a) for a in cells[5].split(" / "))
    assert abs(one - batched) <= 1.0  # equal learners to rounding: a test row at most apart
    assert float(cells[6]) < 1e-5  # float32 learners equal to rounding


def test_femnist_paper_scale_preset_is_the_papers(benchmark_script):
    script = benchmark_script("fedgmm_femnist")
    settings = script.Settings(seeds=(0,), **script.PAPER_SCALE)
    params = settings.model_params(0)
    assert (settings.n_writers, settings.max_iter) == (539, 200)
    assert params["learner"] == "cnn" and params["training"].batch_size == 128
    assert (params["n_components"], params["n_learners"]) == (3, 3)
    assert params["training"].learning_rate == 0.001
    model = script.make_model("FedGMM", script.Settings(8, 2, (0,), batch_clients=False), 0)
    assert model.get_params()["sampling__batch_clients"] is False
