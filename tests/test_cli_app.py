"""``fednovelty app``: the command line it runs, and a message when Streamlit is missing."""

import importlib.util
import subprocess
import sys

import pytest

from fednovelty import cli
from fednovelty.cli import APP_SCRIPT, build_parser, main


class Exec(Exception):
    """Raised by the stand-in for ``os.execv``: the command line it was given."""


def fake_execv(path, command):
    raise Exec(path, command)


def test_app_execs_streamlit_on_the_dashboard(monkeypatch, capsys):
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(cli.os, "execv", fake_execv)
    monkeypatch.setattr(cli.subprocess, "call", lambda command: 1 / 0)  # must not run
    with pytest.raises(Exec) as replaced:  # the process becomes Streamlit: no child to orphan
        main(["app", "--port", "8765", "--headless"])
    path, command = replaced.value.args
    assert path == command[0] == sys.executable
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT)]
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
    assert APP_SCRIPT.is_file() and APP_SCRIPT.parent.name == "app"


def test_app_beyond_localhost_warns_that_it_has_no_login(monkeypatch, capsys):
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(cli.os, "execv", fake_execv)
    with pytest.raises(Exec) as replaced:
        main(["app", "--address", "0.0.0.0", "--headless"])
    command = replaced.value.args[1]
    assert command[command.index("--server.address") + 1] == "0.0.0.0"
    err = capsys.readouterr().err
    assert "no login" in err and "docs/app.md" in err


def test_app_without_streamlit_says_what_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec

    def missing(name):
        return None if name == "streamlit" else real(name)

    monkeypatch.setattr(cli.importlib.util, "find_spec", missing)
    monkeypatch.setattr(cli.subprocess, "call", lambda command: 1 / 0)  # must not run
    monkeypatch.setattr(cli.os, "execv", fake_execv)  # must not run either
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
