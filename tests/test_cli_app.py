"""``fednovelty app``: the command line it runs, and a message when Streamlit is missing."""

import importlib.util
import subprocess
import sys

from fednovelty import cli
from fednovelty.cli import APP_SCRIPT, build_parser, main


def test_app_runs_streamlit_on_the_dashboard(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(cli.subprocess, "call", lambda command: calls.append(command) or 0)
    assert main(["app", "--port", "8765", "--headless"]) == 0
    (command,) = calls
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT)]
    options = dict(zip(command[5::2], command[6::2], strict=True))
    assert options == {
        "--server.address": "127.0.0.1",
        "--server.port": "8765",
        "--server.headless": "true",
        "--browser.gatherUsageStats": "false",
        "--client.toolbarMode": "minimal",
    }
    assert "http://127.0.0.1:8765" in capsys.readouterr().out
    assert APP_SCRIPT.is_file() and APP_SCRIPT.parent.name == "app"


def test_app_without_streamlit_says_what_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec

    def missing(name):
        return None if name == "streamlit" else real(name)

    monkeypatch.setattr(cli.importlib.util, "find_spec", missing)
    monkeypatch.setattr(cli.subprocess, "call", lambda command: 1 / 0)  # must not run
    assert main(["app"]) == 2
    assert "pip install 'fednovelty[app]'" in capsys.readouterr().err


def test_app_options_have_safe_defaults():
    args = build_parser().parse_args(["app"])
    assert (args.address, args.port, args.headless) == ("127.0.0.1", 8501, False)
    assert cli.app_command(args)[cli.app_command(args).index("--server.headless") + 1] == "false"


def test_app_help_from_the_shell():
    out = subprocess.run(
        [sys.executable, "-m", "fednovelty.cli", "app", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--port" in out and "--address" in out
