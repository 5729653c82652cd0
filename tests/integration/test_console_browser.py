"""``ringmaster console`` in a real browser: headless Chromium from the distribution's packages,
driven by Selenium through its chromium-driver, against the real broker, two real daemons and
the real console process. Skipped with one line where no Chromium is installed
(scripts/lib/venv.sh installs it where it can).

With RINGMASTER_CONSOLE_SHOTS=DIR the screenshots are written there (docs/console/ holds the
ones docs/console.md shows: ``RINGMASTER_CONSOLE_SHOTS=docs/console ./scripts/test
tests/integration/test_console_browser.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from helpers import PLUGINS, ROOT, Ringmaster, daemon_config, make_topics, read_all, wait_for

from runtime.dev.tansu import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
    pytest.skip(f"no Chromium here ({CHROMIUM}, {DRIVER}: apt-get install chromium chromium-driver)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

PARTITIONS = 4
PAUSED = 2  # the partition paused by a click
POISONED = 1  # the partition of the letter redriven from the explorer
# This machine's network is closed: nothing of Chromium's own may try to reach out.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    profile = tempfile.mkdtemp(prefix="rm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # The driver named, so Selenium Manager never looks for (or downloads) one.
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Console:
    def __init__(self, config: Path, tmp: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "console.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "console", "-c", str(config),
                                      "--listen", f"127.0.0.1:{self.port}", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def shot(driver: WebDriver, tmp: Path, name: str) -> None:
    driver.save_screenshot(str(tmp / f"{name}.png"))
    shots = os.environ.get("RINGMASTER_CONSOLE_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / f"{name}.png", Path(shots) / f"{name}.png")


def until(driver: WebDriver, what: str, check: Any, timeout_s: float = 60) -> Any:
    def look() -> Any:
        try:
            return check()
        except Exception:  # the page is being replaced by its refresh: look again
            return None
    return wait_for(look, timeout_s, what, interval_s=0.2)


def acks(driver: WebDriver) -> list[str]:
    """What each member says of the action shown."""
    return [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#acks tr[data-member] .pill")]


def send(bootstrap: str, topic: str, partition: int, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for v in values:
        p.produce(topic, v.encode(), partition=partition)
    assert p.flush(30) == 0


def outputs(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.value()) for m in read_all(bootstrap, topic)]


# Every URL the page loaded (the browser's own record of its fetches) and every address it
# would load from (src, stylesheets, icons, forms): all on the console's own origin, so the
# console works on a closed network and tells no third party who looks at it (docs/console.md).
LOADED = """return [...performance.getEntriesByType('navigation'),
  ...performance.getEntriesByType('resource')].map(e => e.name).concat(
  [...document.querySelectorAll('[src]')].map(e => e.src),
  [...document.querySelectorAll('link[href]')].map(e => e.href),
  [...document.querySelectorAll('form[action]')].map(e => e.action))"""


def assert_same_origin(driver: WebDriver, origin: str) -> None:
    urls = driver.execute_script(LOADED)
    assert urls, "the page loaded nothing: the check would pass on anything"
    foreign = [u for u in urls if u and not (u == origin or u.startswith((origin + "/", "data:")))]
    assert not foreign, f"the page reaches outside the console: {foreign}"


def test_the_console_shows_both_members_pauses_a_partition_by_click_and_redrives_a_letter_once(
        broker: Any, names: dict[str, str], tmp_path: Path, browser: WebDriver) -> None:
    bs = broker.bootstrap
    make_topics(bs, PARTITIONS, names["in"])
    make_topics(bs, 1, names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, plugin="console_probe")
    cfg["control"] = {"status_interval_s": 1.0}
    daemons = [Ringmaster(cfg, tmp_path, name=f"rm{i}") for i in range(2)]
    console = Console(daemons[0].config_path, tmp_path)
    try:
        for rm in daemons:
            rm.wait_status(lambda s: s["ready"], 60, "ready")
        base = f"{console.url}/g/{names['group']}"
        browser.get(base)
        pids = {str(rm.proc.pid) for rm in daemons}

        # 1. Both members, and every partition, each held by one of them.
        def members_shown() -> bool:
            cards = browser.find_elements(By.CSS_SELECTOR, ".card.member.state-running")
            return {c.get_attribute("data-member").rpartition(":")[2] for c in cards} == pids
        until(browser, "both members shown as running", members_shown)

        def partitions_shown() -> bool:
            rows = browser.find_elements(By.CSS_SELECTOR, "#partitions tr[data-tp]")
            return sorted(r.get_attribute("data-tp") for r in rows) == \
                [f"{names['in']}[{p}]" for p in range(PARTITIONS)]
        until(browser, "every partition shown", partitions_shown)
        send(bs, names["in"], 0, ["warm-0"])
        until(browser, "an output", lambda: outputs(bs, names["out"]))
        shot(browser, tmp_path, "overview")
        assert_same_origin(browser, console.url)

        # 2. Pause one partition by a click: every member acknowledges it, and while paused no
        # output of it appears though its records arrive (the others' do).
        row = f"#partitions tr[data-tp='{names['in']}[{PAUSED}]']"
        browser.find_element(By.CSS_SELECTOR, f"{row} button.pause").click()
        until(browser, "both members acknowledge the pause", lambda: acks(browser) == ["seen"] * 2)
        shot(browser, tmp_path, "action")
        browser.get(base)
        until(browser, "the partition shown paused by the operator",
              lambda: "operator" in browser.find_element(By.CSS_SELECTOR, row).text)
        for p in range(PARTITIONS):
            send(bs, names["in"], p, [f"p{p}-{i}" for i in range(5)])
        others = {f"p{p}-{i}" for p in range(PARTITIONS) if p != PAUSED for i in range(5)}
        wait_for(lambda: others <= {o["id"] for o in outputs(bs, names["out"])}, 60,
                 "the other partitions' outputs")
        assert not [o for o in outputs(bs, names["out"]) if o["partition"] == PAUSED], \
            "no output of a paused partition"
        shot(browser, tmp_path, "paused")

        # 3. Resume it by a click: its records come out.
        browser.find_element(By.CSS_SELECTOR, f"{row} button.resume").click()
        until(browser, "both members acknowledge the resume", lambda: acks(browser) == ["seen"] * 2)
        wait_for(lambda: {f"p{PAUSED}-{i}" for i in range(5)} <= {o["id"] for o in outputs(bs, names["out"])},
                 60, "the resumed partition's outputs")

        # 4. A poisoned record becomes a dead letter; open it in the explorer and redrive it.
        send(bs, names["in"], POISONED, ["poison:fixed-1"])
        browser.get(f"{base}/letters")
        letter = until(browser, "the letter listed", lambda: browser.find_element(
            By.CSS_SELECTOR, "#letters tr[data-letter] a"), 60)
        shot(browser, tmp_path, "letters")
        assert_same_origin(browser, console.url)
        letter.click()
        until(browser, "the letter in full",
              lambda: "poison:fixed-1" in browser.find_element(By.ID, "value").text)
        assert "poison record: fixed in the next release" in browser.page_source
        shot(browser, tmp_path, "letter")
        assert_same_origin(browser, console.url)
        browser.find_element(By.ID, "plan").click()
        confirm = until(browser, "the plan", lambda: browser.find_element(By.ID, "confirm"))
        assert "would redrive 1" in browser.page_source
        shot(browser, tmp_path, "plan")
        confirm.click()
        until(browser, "the redrive's result",
              lambda: "redriven 1" in browser.find_element(By.ID, "result").text, 120)

        # 5. Its output arrives, once: every partition caught up and committed, then counted.
        wait_for(lambda: "fixed-1" in {o["id"] for o in outputs(bs, names["out"])}, 60, "the redriven output")
        for rm in daemons:
            rm.wait_status(lambda s: all(p["lag"] == 0 for p in s["partitions"]), 60, "caught up")
        assert [o["redriven"] for o in outputs(bs, names["out"]) if o["id"] == "fixed-1"] == [True]
        browser.get(f"{base}/plots")
        shot(browser, tmp_path, "plots")
        assert_same_origin(browser, console.url)
    finally:
        console.close()
        for rm in daemons:
            rm.terminate()
            rm.close()
