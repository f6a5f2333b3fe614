"""Smoke test of ``benchmarks/pfedem_femnist.py``: the quick run writes Table I for both
schedules and the figure; with ``--gaussian-features backbone`` it records pFedEM's backbone
Gaussians and the mlp learners."""


def test_quick_run_writes_table_one_and_the_figure(benchmark_script, tmp_path):
    out, fig = tmp_path / "report.md", tmp_path / "curves.png"
    report = benchmark_script("pfedem_femnist").main(
        ["--quick", "--seeds", "1", "--out", str(out), "--figure", str(fig)]
    )
    assert out.read_text() == report and fig.stat().st_size > 0
    assert "## Table I, Figs. 2-4 (6 writers, 4 windows of one round" in report
    for kind in ("**linear, 1 cycle(s)**", "**cosine, 1 cycle(s)**"):
        assert kind in report
    for name in ("| pFedEM |", "| FedGMM |", "| FedEM |", "| FedAvg |"):
        assert report.count(name) == 2
    assert report.count("PASS") + report.count("FAIL") == 6


def test_quick_run_with_backbone_features_records_them(benchmark_script):
    report = benchmark_script("pfedem_femnist").main(
        ["--quick", "--seeds", "1", "--gaussian-features", "backbone"]
    )
    assert "- learners: mlp, 2 local epochs" in report
    assert (
        "- pFedEM's Gaussians (--gaussian-features backbone): the features of sub-model 0's "
        "layers before its class layer (64 hidden units)"
    ) in report
    assert report.count("| pFedEM |") == 2
    assert report.count("PASS") + report.count("FAIL") == 6


def test_a_second_run_reads_every_fit_back_and_a_variant_shares_the_baselines(
    benchmark_script, tmp_path, capsys
):
    script = benchmark_script("pfedem_femnist")
    quick = ["--quick", "--seeds", "1", "--cycles", "1", "--checkpoints", str(tmp_path)]
    first = script.main(quick)
    kept = sorted(p.name for p in tmp_path.glob("*.pkl"))
    # 2 schedules x 4 methods, each named by schedule, seed, method and learner
    assert len(kept) == 8 and "linear-x1-seed1-pFedEM-linear-input-ours.pkl" in kept
    capsys.readouterr()
    second = script.main(quick)
    assert capsys.readouterr().out.count("resumed ") == 8
    body = lambda text: text.split("## Table I", 1)[1]  # noqa: E731 (the header's seconds differ)
    assert body(second) == body(first)  # the kept fits' own minutes included
    assert " min over 8 fits (each fit's own time, fits kept in --checkpoints" in second
    script.main([*quick, "--paper-algorithm"])  # only pFedEM is fitted again
    assert capsys.readouterr().out.count("resumed ") == 6
    assert len(list(tmp_path.glob("*-pFedEM-linear-input-paper.pkl"))) == 2
