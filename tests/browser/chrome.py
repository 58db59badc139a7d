"""Headless Chromium for the browser tests: Debian's `chromium` and `chromium-driver`
(scripts/test installs them) driven by Selenium, and the directory the screenshots go
to ($DASHBOARD_SCREENSHOTS, or the test's tmp dir; the path is printed). Not a MESHD_*
variable: meshd refuses an environment variable of its prefix that names no setting,
and the nodes under test inherit the environment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 20.0  # seconds a page gets to show what a test waits for


def start_chromium() -> webdriver.Chrome:
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    assert browser and driver, "Chromium and its driver are needed: scripts/test installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,900", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    # the page's console (errors included) is read back by the tests
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def screenshot_dir(tmp_path_factory: Any) -> Path:
    where = os.environ.get("DASHBOARD_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {path}")
    return path


def wait_until(browser: webdriver.Chrome, condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll `condition` (run in the test, reading the page) until it is truthy."""
    return WebDriverWait(browser, timeout, poll_frequency=0.05,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
                         ).until(lambda _: condition(), message=what)


def console_errors(browser: webdriver.Chrome) -> list[str]:
    """The page's errors, less the API's 404s it answers itself (a client just kicked,
    whose session went with it, is no longer found)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"
            and not ("/api/v1/" in e["message"] and "status of 404" in e["message"])]
