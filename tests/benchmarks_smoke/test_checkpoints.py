"""``benchmarks.checkpoints``: finished units kept, read back under the same settings only."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture
def checkpoints(benchmark_script):
    return benchmark_script("checkpoints")


def test_a_unit_is_computed_once_and_read_back(checkpoints, tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"auroc": 0.9}

    first = checkpoints.Checkpoints(tmp_path, "settings A")
    assert first.get("seed0", compute) == {"auroc": 0.9}
    second = checkpoints.Checkpoints(tmp_path, "settings A")
    assert second.get("seed0", compute) == {"auroc": 0.9}
    assert len(calls) == 1
    assert second.resumed == ["seed0"] and first.computed == ["seed0"]
    assert "1 units read back, 0 computed" in second.provenance()


def test_other_settings_recompute_and_no_folder_keeps_nothing(checkpoints, tmp_path):
    checkpoints.Checkpoints(tmp_path, "A").get("k", lambda: 1)
    assert checkpoints.Checkpoints(tmp_path, "B").get("k", lambda: 2) == 2
    assert checkpoints.Checkpoints(tmp_path, "B").get("k", lambda: 3) == 2
    nothing = checkpoints.Checkpoints(None, "A")
    assert nothing.get("k", lambda: 4) == 4 and nothing.get("k", lambda: 5) == 5
    assert not list(tmp_path.glob("*.partial"))


def test_a_torn_file_is_computed_again(checkpoints, tmp_path):
    (tmp_path / "k.pkl").write_bytes(b"\x80\x04 torn")
    assert checkpoints.Checkpoints(tmp_path, "A").get("k", lambda: 7) == 7
    assert checkpoints.Checkpoints(tmp_path, "A").get("k", lambda: 8) == 7


def test_keys_are_checked(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="checkpoint key"):
        checkpoints.Checkpoints(tmp_path, "A").get("../escape", lambda: 1)


def test_signature_ignores_where_the_run_writes(checkpoints, tmp_path):
    @dataclasses.dataclass
    class Settings:
        seeds: tuple
        out: object = None
        checkpoints: object = None

    a = checkpoints.settings_signature(Settings((0, 1), out=tmp_path / "a"))
    b = checkpoints.settings_signature(Settings((0, 1), out=tmp_path / "b", checkpoints=3))
    assert a == b != checkpoints.settings_signature(Settings((0,)))


def test_paper_tables_resume_finished_seeds_without_building_their_data(benchmark_script, tmp_path):
    common, checkpoints = benchmark_script("common"), benchmark_script("checkpoints")
    built, ran = [], []

    @dataclasses.dataclass(frozen=True)
    class Settings:
        seeds: tuple

    def data(settings, seed):
        built.append(seed)
        return seed * 10

    def run_seed(data, settings, seed):
        ran.append(seed)
        return {"value": data + 1}

    spec = common.PaperTables(
        "t",
        data,
        (common.Experiment("e", "E", run_seed, lambda r, s: str([x["value"] for x in r])),),
    )

    def run(seeds):
        ck = checkpoints.Checkpoints(tmp_path, "same")
        return common.run_paper_tables(
            spec, Settings(seeds), "all", "cmd", False, None, checkpoints=ck
        )

    assert "[1, 11]" in run((0, 1))
    assert "[1, 11, 21]" in run((0, 1, 2))
    assert built == [0, 1, 2] and ran == [0, 1, 2]
