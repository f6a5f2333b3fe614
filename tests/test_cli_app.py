"""``fednovelty app``: where the dashboard is, the command line it runs, and messages when
Streamlit, Plotly or the dashboard's files are missing."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from fednovelty._cli import dashboard
from fednovelty.cli import build_parser, dashboard_script, main

REPO = Path(__file__).resolve().parents[1]


class Exec(Exception):
    """Raised by the stand-in for ``os.execv``: the command line it was given."""


def fake_execv(path, command):
    raise Exec(path, command)


@pytest.fixture
def no_launch(monkeypatch):
    """``os.execv`` raises ``Exec``; ``subprocess.call`` must not run."""
    monkeypatch.setattr(dashboard.os, "execv", fake_execv)
    monkeypatch.setattr(dashboard.subprocess, "call", lambda command: 1 / 0)


def test_the_dashboard_is_this_source_trees_app_folder():
    script = dashboard_script()
    assert script == REPO / "app" / "Home.py"
    assert (script.parent / "pages" / "1_Train.py").is_file()
    assert (script.parent / "fednovelty_app" / "ui.py").is_file()


def _dashboard_folder(root: Path) -> Path:
    """A stand-in dashboard under ``root``: ``Home.py`` and ``pages/``; its ``Home.py``."""
    (root / "pages").mkdir(parents=True)
    (root / "Home.py").write_text("")
    return root / "Home.py"


def test_installed_the_dashboard_is_the_package_resource(monkeypatch, tmp_path):
    installed = _dashboard_folder(tmp_path / "site-packages" / "fednovelty" / "dashboard")
    monkeypatch.setattr(dashboard, "SOURCE_TREE", tmp_path / "site-packages")  # no pyproject
    seen = []

    def files(package):
        seen.append(package)
        return installed.parent

    monkeypatch.setattr(dashboard.importlib.resources, "files", files)
    assert dashboard_script() == installed
    assert seen == ["fednovelty.dashboard"]


def test_app_execs_streamlit_on_the_dashboard(monkeypatch, capsys, no_launch):
    monkeypatch.setattr(dashboard, "missing_extras", lambda: [])
    with pytest.raises(Exec) as replaced:  # the process becomes Streamlit: no child to orphan
        main(["app", "--port", "8765", "--headless"])
    path, command = replaced.value.args
    assert path == command[0] == sys.executable
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", str(dashboard_script())]
    options = dict(zip(command[5::2], command[6::2], strict=True))
    assert options == {
        "--server.address": "127.0.0.1",
        "--server.port": "8765",
        "--server.headless": "true",
        "--browser.gatherUsageStats": "false",
        "--client.toolbarMode": "minimal",
    }
    out, err = capsys.readouterr()
    assert "http://127.0.0.1:8765" in out and "warning" not in err


def test_app_beyond_localhost_warns_that_it_has_no_login(monkeypatch, capsys, no_launch):
    monkeypatch.setattr(dashboard, "missing_extras", lambda: [])
    with pytest.raises(Exec) as replaced:
        main(["app", "--address", "0.0.0.0", "--headless"])
    command = replaced.value.args[1]
    assert command[command.index("--server.address") + 1] == "0.0.0.0"
    err = capsys.readouterr().err
    assert "no login" in err and "docs/app.md" in err


@pytest.mark.parametrize("absent", [{"streamlit"}, {"plotly"}, {"streamlit", "plotly"}])
def test_app_without_the_extra_says_what_to_install(monkeypatch, capsys, no_launch, absent):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        dashboard.importlib.util, "find_spec", lambda name: None if name in absent else real(name)
    )
    assert main(["app"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fednovelty: error: the dashboard needs Streamlit and Plotly")
    assert "pip install 'fednovelty[app]'" in err
    assert all(name in err for name in absent)


def _not_installed(package):
    raise ModuleNotFoundError(f"No module named {package!r}")


def test_no_dashboard_files_is_a_usage_error(monkeypatch, capsys, no_launch, tmp_path):
    monkeypatch.setattr(dashboard, "SOURCE_TREE", tmp_path)
    monkeypatch.setattr(dashboard.importlib.resources, "files", _not_installed)
    monkeypatch.setattr(dashboard, "missing_extras", lambda: [])
    assert main(["app"]) == 2
    err = capsys.readouterr().err
    assert "no dashboard found (fednovelty.dashboard is missing)" in err and "reinstall" in err
    (tmp_path / "pyproject.toml").write_text("")  # a source tree whose app/ has no pages/
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "Home.py").write_text("")
    with pytest.raises(dashboard.UsageError, match="pages/ folder is missing"):
        dashboard_script()
    (tmp_path / "app" / "pages").mkdir()
    assert dashboard_script() == tmp_path / "app" / "Home.py"


def test_app_options_have_safe_defaults():
    args = build_parser().parse_args(["app"])
    assert (args.address, args.port, args.headless) == ("127.0.0.1", 8501, False)
    command = dashboard.app_command(args)
    assert command[command.index("--server.headless") + 1] == "false"


def test_app_help_from_the_shell():
    out = subprocess.run(
        [sys.executable, "-m", "fednovelty.cli", "app", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--port" in out and "--address" in out
