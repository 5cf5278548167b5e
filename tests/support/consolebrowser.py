"""
The web console in a real headless Chromium (Debian's ``chromium``), driven over WebDriver by
Selenium through Debian's ``chromium-driver``: what a person clicks, and a screenshot of each
page kept as a test artifact (``.artifacts/console/``, not in git).
"""

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

ARTIFACTS = (
    Path(os.environ.get('SHOAL_TEST_ARTIFACTS', Path(__file__).parents[2] / '.artifacts'))
    / 'console'
)
"""Where the screenshots are kept for a person to look at."""
WAIT_SECONDS = 20.0
WIDTH = 1400

FLAGS = (
    '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
    '--no-first-run', '--no-default-browser-check', '--disable-extensions', '--disable-sync',
    '--disable-background-networking', '--disable-component-update', '--disable-default-apps',
    '--disable-features=Translate,OptimizationHints,MediaRouter', f'--window-size={WIDTH},1000',
)  # fmt: skip
"""Headless, and nothing fetched beyond the page's own origin (no updates, no sync)."""


class Console:
    """One Chromium on one broker's console; ``base`` is ``http://host:port``."""

    def __init__(self, base: str) -> None:
        chromium, driver = shutil.which('chromium'), shutil.which('chromedriver')
        assert chromium, 'chromium is not installed (make test installs it)'
        assert driver, 'chromedriver is not installed (make test installs chromium-driver)'
        options = Options()
        options.binary_location = chromium
        for flag in FLAGS:
            options.add_argument(flag)
        options.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
        self.base = base
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        self.driver.quit()

    def open(self, route: str = '') -> None:
        """A console route (``#/queues?search=x``): a load, or a hash change the console
        routes as a click on one of its links does."""
        self.driver.get(f'{self.base}/console/{route}')

    def wait(self, what: Callable[[], Any], message: str) -> Any:
        """What ``what`` returns once truthy (an element gone stale counts as not yet)."""

        def ready(_: Any) -> Any:
            try:
                return what()
            except StaleElementReferenceException:
                return False

        try:
            return WebDriverWait(self.driver, WAIT_SECONDS, poll_frequency=0.1).until(
                ready, message
            )
        except TimeoutException:
            self.shot('last-failure')
            notice = self.driver.find_element(By.ID, 'notice')
            raise AssertionError(
                f'not {message}; the console says {notice.text!r} (last-failure.png)'
            ) from None

    def find(self, css: str) -> WebElement:
        return self.wait(lambda: self.visible(css), f'{css} shown')

    def visible(self, css: str) -> WebElement | None:
        for el in self.driver.find_elements(By.CSS_SELECTOR, css):
            if el.is_displayed():
                return el
        return None

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def attributes(self, css: str, name: str) -> list[str]:
        """Attribute ``name`` of every element ``css`` finds, read in one call in the page (one
        WebDriver round trip per element made a page of 500 rows outlast the wait under load)."""
        found = self.driver.execute_script(
            'return Array.from(document.querySelectorAll(arguments[0]), '
            'e => e.getAttribute(arguments[1]))',
            css,
            name,
        )
        return [str(value) for value in found]

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def click(self, css: str) -> None:
        self.find(css).click()

    def type(self, css: str, text: str) -> None:
        box = self.find(css)
        box.clear()
        box.send_keys(text)

    def wait_text(self, css: str, part: str) -> str:
        """The text of ``css`` once it contains ``part``."""

        def shown() -> str | None:
            el = self.visible(css)
            return el.text if el is not None and part in el.text else None

        return str(self.wait(shown, f'{css} says {part!r}'))

    def choose(self, css: str, value: str) -> None:
        """Picks the option of value ``value`` in the ``<select>`` at ``css``."""
        Select(self.find(css)).select_by_value(value)

    def login(self, user: str, password: str) -> None:
        self.type('#login-user', user)
        self.type('#login-password', password)
        self.click('#login-submit')

    def confirm(self, ok: bool) -> str:
        """Answers the confirmation dialog; returns what it asked."""
        asked = self.text('#confirm-text')
        self.click('#confirm-ok' if ok else '#confirm-cancel')
        self.wait(lambda: not self.driver.find_element(By.ID, 'confirm').is_displayed(), 'closed')
        return asked

    def requests(self) -> list[str]:
        """Every URL the page fetched (scripts, styles, API calls)."""
        found = self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(r => r.name)"
        )
        return [str(url) for url in found]

    def errors(self) -> list[str]:
        """What the page logged as errors since the last call (script errors, refused
        Content-Security-Policy loads, failed requests)."""
        return [str(e['message']) for e in self.driver.get_log('browser') if e['level'] == 'SEVERE']

    def shot(self, name: str) -> Path:
        """A screenshot of the whole page as ``<name>.png`` among the artifacts."""
        height = int(self.driver.execute_script('return document.documentElement.scrollHeight'))
        self.driver.set_window_size(WIDTH, max(800, min(height + 40, 6000)))
        path = ARTIFACTS / f'{name}.png'
        assert self.driver.save_screenshot(str(path)), path
        self.driver.set_window_size(WIDTH, 1000)
        return path
