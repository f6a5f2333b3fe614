"""Mistakes on the command line and in its tables: "did you mean" for a mistyped choice or
column, a port outside 0-65535, a header that names a column twice, a column of text."""

import numpy as np
import pandas as pd
import pytest

from fednovelty._cli.choices import closest, did_you_mean
from fednovelty.cli import build_parser, main
from fednovelty.methods import method_names


def _error_of(argv, capsys) -> str:
    """The one error line argparse prints for ``argv`` (it exits with status 2)."""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def _csv(tmp_path, text: str, name: str = "data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _table(tmp_path, n: int = 120):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["alcohol", "ash", "hue"])
    frame["site"] = rng.choice(["north", "south", "east"], n)
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    return path


def test_a_mistyped_method_names_the_closest_methods_not_all_of_them(capsys):
    line = _error_of(["fit", "x.csv", "--out", "m", "--method", "FedGM"], capsys)
    assert "did you mean 'FedGMM'" in line
    assert len(line) < 200 and "KNN-markers" not in line  # not the list of every method


def test_a_mistyped_short_choice_or_command_names_the_closest_and_the_list(capsys):
    line = _error_of(["bench", "--out", "x", "--metric", "aurocc"], capsys)
    assert "did you mean 'auroc'?" in line and "choose from auroc, aupr_in" in line
    assert "did you mean 'fit'?" in _error_of(["fti"], capsys)


def test_closest_prefers_a_case_insensitive_match():
    assert closest("fedgmm", method_names(variants=True))[0] == "FedGMM"
    assert closest("zzzz", ["a", "b"]) == []
    assert did_you_mean("zzzz", [str(i) for i in range(20)]).endswith("--help lists them)")


def test_a_mistyped_client_column_names_the_closest_columns(tmp_path, capsys):
    data = _table(tmp_path)
    code = main(["fit", str(data), "--client-column", "sites", "--out", str(tmp_path / "m")])
    assert code == 2
    assert "did you mean 'site'?" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "99999", "65536"])
def test_a_port_outside_0_65535_is_refused_by_the_parser(port, capsys):
    line = _error_of(["app", "--port", port], capsys)
    assert (
        line
        == f"fednovelty app: error: argument --port: expected a port number 0-65535, got {port}"
    )


def test_a_port_in_range_is_taken():
    assert build_parser().parse_args(["app", "--port", "0"]).port == 0
    assert build_parser().parse_args(["app", "--port", "65535"]).port == 65535


def test_a_header_that_repeats_a_name_is_refused_naming_it(tmp_path, capsys):
    rows = "\n".join(f"{i},{i % 3},{i * 2 % 7}" for i in range(40))
    data = _csv(tmp_path, "f0,f0,f2\n" + rows + "\n")
    assert main(["fit", str(data), "--method", "CentralGMM", "--components", "1",
                 "--out", str(tmp_path / "m.safetensors")]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "column 'f0' twice (columns 1, 2)" in err and "f0.1" not in err
    assert not (tmp_path / "m.safetensors").exists()


def test_a_text_column_is_named_with_a_bad_value(tmp_path, capsys):
    frame = pd.DataFrame({"alcohol": np.arange(40.0), "ash": np.arange(40.0) % 7})
    frame["ash"] = frame["ash"].astype(object)
    frame.loc[17, "ash"] = "bad"
    data = tmp_path / "t.csv"
    frame.to_csv(data, index=False)
    assert main(["fit", str(data), "--out", str(tmp_path / "m.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "column 'ash'" in err and "row 17: 'bad'" in err
    assert "--client-column" not in err  # 8 distinct values in 40 rows, but mostly numbers


def test_a_forgotten_client_column_is_suggested(tmp_path, capsys):
    data = _table(tmp_path)
    assert main(["fit", str(data), "--out", str(tmp_path / "m.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "column 'site' holds text" in err and "pass --client-column site" in err
