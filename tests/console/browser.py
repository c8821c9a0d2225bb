"""Headless Chromium from Debian's packages (`make browser`), driven by Selenium.

The driver is the system's `chromedriver`, named explicitly so Selenium never looks
for one to download. `METIS_SCREENSHOTS=docs/` makes `screenshot` save PNGs there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

WAIT_SECONDS = 60.0


def chrome(width: int = 1280, height: int = 900) -> webdriver.Chrome:
    """A headless Chromium window of `width` × `height` CSS pixels."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        raise RuntimeError("chromium and chromium-driver are missing: run `make browser`")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def wait(
    driver: webdriver.Chrome, what: str, check: Callable[[Any], Any], timeout: float = WAIT_SECONDS
) -> Any:
    """Poll `check(driver)` until it is truthy (Selenium's own polling, with a deadline).
    A live page replaces rows as updates arrive: an element found a moment before may be
    gone when it is read, which is another round, not a failure."""
    return WebDriverWait(
        driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check, f"waiting for {what}")


def screenshot(driver: webdriver.Chrome, name: str) -> None:
    """Save the page as `<METIS_SCREENSHOTS>/<name>.png` when that folder is set."""
    folder = os.environ.get("METIS_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        width = driver.get_window_size()["width"]
        driver.set_window_size(width, min(max(height + 120, 600), 2400))
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def fits(driver: webdriver.Chrome) -> bool:
    """No sideways scrolling: the page is no wider than the window."""
    return bool(
        driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    )
