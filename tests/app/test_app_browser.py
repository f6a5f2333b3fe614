"""The dashboard in a real browser: ``streamlit run`` on a free local port, Debian's Chromium
driven by Playwright (never ``playwright install``: browser downloads fail here).

One test visits every page through the sidebar (a full page load would start a new session
and forget the trained model), trains the default model, adds a rogue client on the Clusters
page (its federation refits), checks that no Streamlit exception box appears, and saves a
screenshot of each page to ``$PYTEST_ARTIFACTS/app`` (default ``tests/app/artifacts/``,
ignored by git).
"""

import contextlib
import os
import re
import time
from pathlib import Path

import pytest

from fednovelty.cli import serving_app

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: How long any one wait may take, in ms: generous, because these are waits, not budgets (the
#: latency budgets are benchmarks/bench_app.py's; docs/app.md, Latency).
WAIT_MS = 180_000
EXCEPTION = '[data-testid="stException"]'
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
PLOT = ".js-plotly-plot"
METRIC = '[data-testid="stMetricValue"]'
#: Sidebar label -> (heading the page shows, Plotly charts expected once a model exists).
PAGES = {
    "Scores": ("Scores", 4),
    "Joint view": ("Joint view: is the input novel, or its label?", 1),
    "Clients": ("Clients", 4),
    "Unseen client": ("Unseen client", 1),
    "Score your data": ("Score your data", 0),
    "Drift": ("Drift", 2),
    "Clusters": ("Clusters", 4),
}


def artifacts_dir() -> Path:
    root = os.environ.get("PYTEST_ARTIFACTS")
    folder = Path(root) / "app" if root else Path(__file__).parent / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def server(app_dir, tmp_path_factory):
    """``streamlit run app/Home.py`` on 127.0.0.1 and a free port; yields its URL and the
    seconds from launch until its health check answered."""
    if not CHROMIUM.exists():
        pytest.fail(  # `make test` installs it; a missing browser must not pass silently
            "needs Debian's chromium at /usr/bin/chromium: run `make test`, or "
            "`apt-get install -y chromium`"
        )
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    with contextlib.ExitStack() as stack:
        try:  # what `fednovelty app` runs
            served = stack.enter_context(serving_app(log_path, WAIT_MS / 1000, app_dir / "Home.py"))
        except (RuntimeError, TimeoutError) as error:
            pytest.fail(f"streamlit did not start: {error}")
        yield served


def settle(page, timeout: float = WAIT_MS / 1000) -> None:
    """Wait until the script run that an action started has finished."""
    try:
        page.wait_for_selector('[data-test-script-state="running"]', timeout=1500)
    except sync_api.TimeoutError:
        pass  # the run was already over
    page.wait_for_selector(IDLE, timeout=timeout * 1000)


def check_and_shoot(page, name: str, folder: Path) -> None:
    """No exception box; a screenshot of the page's content (the sidebar left out)."""
    assert page.locator(EXCEPTION).count() == 0, page.locator(EXCEPTION).all_inner_texts()
    page.locator('[data-testid="stMainBlockContainer"]').screenshot(
        path=str(folder / f"{name}.png"), animations="disabled"
    )


def open_page(page, label: str) -> None:
    page.locator('[data-testid="stSidebarNav"] a', has_text=label).first.click()
    settle(page)


def test_every_page_in_chromium(server):
    url, server_seconds = server
    folder = artifacts_dir()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.set_default_timeout(WAIT_MS)
            started = time.perf_counter()
            page.goto(url)
            page.get_by_role("heading", name="fednovelty dashboard").wait_for()
            first_page = time.perf_counter() - started
            settle(page)
            # Timings are printed, never asserted: the latency budgets are checked by
            # benchmarks/bench_app.py on an idle machine (here other pytest workers compete).
            print(f"server up in {server_seconds:.1f} s; first page in {first_page:.1f} s")
            check_and_shoot(page, "0_home", folder)

            open_page(page, "Train")
            page.get_by_role("heading", name="Train", exact=True).wait_for()
            started = time.perf_counter()
            page.get_by_role("button", name="Train", exact=True).click()
            page.get_by_text("Current model:").wait_for()
            # The metrics render after the test rows are scored; on a loaded machine the
            # browser can report the run finished before it has drawn them, so wait for them.
            page.get_by_text("Test AUROC").wait_for()
            settle(page)
            training = time.perf_counter() - started
            print(f"default training shown after {training:.1f} s")
            assert page.get_by_text("Test AUROC").count() == 1
            check_and_shoot(page, "1_train", folder)

            for number, (label, (heading, n_plots)) in enumerate(PAGES.items(), start=2):
                open_page(page, label)
                page.get_by_role("heading", name=heading, exact=True).wait_for()
                if n_plots:
                    page.locator(PLOT).nth(n_plots - 1).wait_for()
                assert page.locator(PLOT).count() == n_plots, label
                check_and_shoot(page, f"{number}_{label.lower().replace(' ', '_')}", folder)

            # Clusters (the last page visited): one more rogue client refits the federation.
            page.get_by_role("slider", name="Rogue clients").press("ArrowRight")
            settle(page)
            rogues = page.locator(METRIC, has_text=re.compile(r"^\d of 2$"))
            rogues.wait_for()
            assert rogues.inner_text() == "2 of 2"  # both rogue clients flagged
            assert page.locator(PLOT).count() == PAGES["Clusters"][1]
            check_and_shoot(page, f"{len(PAGES) + 2}_clusters_two_rogues", folder)
        finally:
            browser.close()
