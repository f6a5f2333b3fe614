"""The package's top level: detectors load lazily, the names it promises resolve, and the wheel
holds every module and the dashboard (``fednovelty app`` runs from an installed wheel)."""

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The dashboard's folder and the package it installs as (pyproject.toml's package-dir).
DASHBOARD = ("app", "fednovelty.dashboard")
#: The Flower app template ``fednovelty flower new`` writes: its .py files, pyproject.toml
#: and README.md.
TEMPLATE_PACKAGE = "fednovelty.runtime.flower.app_template"
#: The longest module of the package, in lines: one idea per module (docs/contributing.md).
MOST_MODULE_LINES = 600


def test_algorithm_layers_do_not_import_pyod():
    code = (
        "import sys, fednovelty, fednovelty.federated, fednovelty.runtime; "
        "print('pyod' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_client_app_of_federated_em_imports_neither_scikit_learn_nor_scipy_stats():
    """Each Flower message starts a ClientApp process: it imports the engine and the one
    algorithm it runs (about 2 s of CPU less than with every family and scikit-learn)."""
    code = (
        "import sys, fednovelty.runtime.flower.client, fednovelty.federated.registry as r; "
        "r.build_algorithm('FederatedEM', {'n_components': 2}); "
        "print(sorted(m for m in ('sklearn', 'scipy.stats', 'pyod') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = code.replace(
        "r.build_algorithm('FederatedEM', {'n_components': 2})",
        "r.ALGORITHMS['FederatedKNNMarkers']",
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "sklearn" in out.stdout  # the probe: an algorithm that needs scikit-learn loads it


def test_public_names_resolve():
    import fednovelty
    from fednovelty.detectors import FedGMMDetector

    assert fednovelty.FedGMMDetector is FedGMMDetector
    assert set(fednovelty.__all__) <= set(dir(fednovelty))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        fednovelty.Nope  # noqa: B018


def _long_modules(root: Path, most: int) -> dict[str, int]:
    """The modules under ``root`` with more than ``most`` lines, by path."""
    lengths = {
        str(p.relative_to(root)): len(p.read_text().splitlines()) for p in root.rglob("*.py")
    }
    return {path: n for path, n in lengths.items() if n > most}


def test_no_module_is_over_600_lines(tmp_path):
    assert _long_modules(REPO / "fednovelty", MOST_MODULE_LINES) == {}
    (tmp_path / "long.py").write_text("x = 1\n" * (MOST_MODULE_LINES + 1))
    assert _long_modules(tmp_path, MOST_MODULE_LINES) == {"long.py": MOST_MODULE_LINES + 1}


def _package_folders(root: Path, package: str) -> set[str]:
    """Dotted names of ``root`` and every folder under it holding a ``.py`` file."""
    return {
        ".".join([package, *folder.relative_to(root).parts])
        for folder in [root, *root.rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py"))
    }


def test_pyproject_lists_every_package():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folder, package = DASHBOARD
    assert setuptools["package-dir"] == {package: folder}
    assert setuptools["package-data"] == {
        package: ["pages/*.py"],
        TEMPLATE_PACKAGE: ["pyproject.toml", "README.md"],
    }
    expected = _package_folders(REPO / "fednovelty", "fednovelty")
    expected |= _package_folders(REPO / folder, package) - {f"{package}.pages"}  # pages: data
    missing = sorted(expected - set(setuptools["packages"]))
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"
    assert sorted(set(setuptools["packages"]) - expected) == []


def _checkout_files(folder: str, installed_as: str) -> set[str]:
    """The checkout's ``.py`` files under ``folder``, as paths inside the wheel."""
    root = REPO / folder
    return {
        "/".join([*installed_as.split("."), *path.relative_to(root).parts])
        for path in root.rglob("*.py")
        if "__pycache__" not in path.parts
    }


def _free_port() -> int:
    from fednovelty.runtime.flower.deploy import free_port

    return free_port()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout (pip, no build isolation, no network)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("fednovelty", "app"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(source), "-w", str(work / "dist")],
        check=True, capture_output=True, cwd=work,
    )  # fmt: skip
    (built,) = (work / "dist").glob("fednovelty-*.whl")
    return built


def test_the_wheel_holds_every_module_and_the_dashboard(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    dashboard = _checkout_files(*DASHBOARD)
    assert {
        "fednovelty/dashboard/Home.py",
        "fednovelty/dashboard/pages/1_Train.py",
        "fednovelty/dashboard/fednovelty_app/ui.py",
    } <= dashboard
    template = {f"{TEMPLATE_PACKAGE.replace('.', '/')}/{name}" for name in ("pyproject.toml",
                "README.md", "server_app.py", "client_app.py")}  # fmt: skip
    missing = (_checkout_files("fednovelty", "fednovelty") | dashboard | template) - names
    assert not missing, f"the wheel lacks {sorted(missing)}"
    assert not [name for name in names if name.startswith(("app/", "tests/", "benchmarks/"))]


def test_fednovelty_app_runs_from_the_installed_wheel(wheel, tmp_path):
    """Install the wheel in a fresh venv (its dependencies from this environment's
    site-packages), then, from a folder outside the checkout, find the dashboard, run its first
    page with the installed ``fednovelty_app``, and serve it with ``fednovelty app``."""
    pytest.importorskip("streamlit", reason="the dashboard needs fednovelty[app]")
    from fednovelty.runtime.flower.deploy import wait_for_http

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    # a plain path entry: this environment's packages, without its .pth files (so not the
    # editable install of the checkout)
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         "--no-warn-conflicts", str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import sys, fednovelty\n"
        "from fednovelty.cli import dashboard_script\n"
        "script = dashboard_script()\n"
        "sys.path.insert(0, str(script.parent))  # as streamlit run does\n"
        "from streamlit.testing.v1 import AppTest\n"
        "import fednovelty_app\n"
        "home = AppTest.from_file(str(script), default_timeout=60).run()\n"
        "assert not home.exception, home.exception\n"
        "print(fednovelty.__file__, script, fednovelty_app.__file__, home.title[0].value, "
        "sep='\\n')\n"
    )
    shown = subprocess.run(
        [python, "-c", code], cwd=outside, env=env, check=True, capture_output=True, text=True
    ).stdout.splitlines()
    package, script, helpers, title = shown[-4:]
    installed = site / "fednovelty"
    assert Path(package) == installed / "__init__.py"
    assert Path(script) == installed / "dashboard" / "Home.py"
    assert Path(helpers) == installed / "dashboard" / "fednovelty_app" / "__init__.py"
    assert title == "fednovelty dashboard"

    port = _free_port()
    log_path = tmp_path / "app.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [venv / "bin" / "fednovelty", "app", "--port", str(port), "--headless"],
            cwd=outside, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/_stcore/health", 120, process, log_path)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    served = log_path.read_text()
    assert f"http://127.0.0.1:{port}" in served
