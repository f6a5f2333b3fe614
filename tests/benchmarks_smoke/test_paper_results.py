"""``benchmarks.paper_results``: one format for the papers' tables, and docs built from it."""

from __future__ import annotations

import pytest


@pytest.fixture
def paper_results(benchmark_script):
    return benchmark_script("paper_results")


def table(paper_results, **changes):
    fields = dict(
        name="fedgmm-t4-test",
        title="FedGMM Table 4 (test)",
        scale="paper",
        paper="FedGMM (000), Table 4",
        command="python -m benchmarks.fedgmm_mnist --paper-scale",
        algorithm="paper and default",
        differs="none",
        seeds=(0, 1),
        device="cpu",
        header=["score", "paper AUROC", "ours"],
        rows=[["log p(x)", "99.21", "98.9 ± 0.1"], ["p(y|x)", "-", "97.0"]],
        verdict="within 0.5 of the paper.",
        date="2026-12-03",
        commit="abc1234",
    )
    fields.update(changes)
    return paper_results.PaperTable(**fields)


def test_a_table_written_passes_the_check_and_reads_as_its_fields(paper_results, tmp_path):
    path = paper_results.write(table(paper_results), tmp_path)
    text = path.read_text()
    assert text.splitlines()[0] == "scale: paper"
    assert paper_results.check_text(text) == []
    assert "| p(y\\|x) | - | 97.0 |" in text  # a '|' in a cell does not split it
    assert "- commit: abc1234" in text and "- seeds: 0 1" in text
    reduced = table(paper_results, scale="reduced (30 clients, not 300)").markdown()
    assert reduced.startswith("scale: reduced (30 clients, not 300)\n")


def test_a_rebuild_that_changes_only_date_and_commit_keeps_the_file(paper_results, tmp_path):
    path = paper_results.write(table(paper_results), tmp_path)
    paper_results.write(table(paper_results, date="2027-01-01", commit="def5678"), tmp_path)
    assert "- commit: abc1234" in path.read_text()  # built at the first commit, kept
    paper_results.write(table(paper_results, verdict="changed.", commit="def5678"), tmp_path)
    assert "- commit: def5678" in path.read_text() and "changed." in path.read_text()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"scale": "full"}, "scale"),
        ({"header": ["score", "ours", "paper"]}, "second column"),
        ({"rows": [["only", "two"]]}, "cells"),
        ({"name": "T4"}, "name"),
    ],
)
def test_fields_that_break_the_format_are_refused(paper_results, change, match):
    with pytest.raises(ValueError, match=match):
        table(paper_results, **change).markdown()


def test_check_names_what_a_file_lacks(paper_results):
    text = table(paper_results).markdown()
    assert paper_results.check_text(text.replace("scale: paper", "scale: big", 1))
    assert any("verdict" in p.lower() for p in paper_results.check_text(text.split("**Verdict")[0]))
    assert any("commit" in p for p in paper_results.check_text(text.replace("- commit:", "- c:")))


def test_docs_blocks_are_refreshed_from_the_files(paper_results, tmp_path):
    papers, docs = tmp_path / "papers", tmp_path / "docs"
    docs.mkdir()
    paper_results.write(table(paper_results), papers)
    page = docs / "fedgmm.md"
    page.write_text("# Page\n\n<!-- paper-table: fedgmm-t4-test -->\nold\n<!-- /paper-table -->\n")
    assert any("differs" in p for p in paper_results.check(papers, docs))
    assert paper_results.refresh_docs(papers, docs) == [page]
    assert paper_results.check(papers, docs) == []
    body = paper_results.docs_blocks(page.read_text())["fedgmm-t4-test"]
    assert body.startswith("### FedGMM Table 4 (test)\n\n- scale: paper\n")
    (papers / "orphan-t1.md").write_text(table(paper_results, name="orphan-t1").markdown())
    assert paper_results.check(papers, docs) == ["orphan-t1.md: no docs page includes it"]


def test_the_repository_files_and_docs_agree(paper_results):
    assert paper_results.check() == []
