"""``fednovelty --help``, ``COMMAND --help`` and ``--version`` import no torch, PyOD or
scikit-learn; the parser's fixed choices equal the constants they copy."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "pyod", "sklearn", "pandas")
COMMANDS = [["--help"], ["--version"], *([name, "--help"] for name in
            ("demo", "fit", "score", "bench", "app", "flower")),
            ["flower", "new", "--help"]]  # fmt: skip


def _imported(argv: list[str]) -> tuple[list[str], str]:
    """The heavy modules a process printing ``fednovelty ARGV`` imported, and its output."""
    code = (
        "import json, sys\n"
        "from fednovelty.cli import main\n"
        f"sys.argv = ['fednovelty', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as stop:\n    assert not stop.code, stop.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1]), done.stdout


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_and_version_import_no_torch_pyod_or_sklearn(argv):
    imported, out = _imported(argv)
    assert imported == []
    assert "usage: fednovelty" in out or out.startswith("fednovelty ")


def test_version_names_the_package_version(capsys):
    import fednovelty
    from fednovelty.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"fednovelty {fednovelty.__version__}"


def test_the_parsers_choices_equal_their_sources():
    from fednovelty._cli import choices
    from fednovelty.datasets.protocols import PARTITIONS
    from fednovelty.datasets.streams import SCHEDULES
    from fednovelty.evaluation.ablations import ABLATIONS
    from fednovelty.evaluation.results import METRICS
    from fednovelty.evaluation.streams import DEFAULT_REFITTED, STREAM_ROLES
    from fednovelty.mixture.covariance import COVARIANCE_TYPES

    assert choices.PARTITIONS == tuple(PARTITIONS)
    assert choices.SCHEDULES == tuple(SCHEDULES)
    assert choices.ABLATION_NAMES == tuple(ABLATIONS)
    assert choices.METRICS == tuple(METRICS)
    assert choices.STREAM_ROLES == tuple(STREAM_ROLES)
    assert choices.DEFAULT_REFITTED == DEFAULT_REFITTED
    assert choices.COVARIANCE_TYPES == tuple(COVARIANCE_TYPES)
