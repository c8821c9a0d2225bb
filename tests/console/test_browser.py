"""The Search page in a real browser (headless Chromium), served by a real `metis serve`
over the example handbook with the real local model (`metis models`) as embedding
model and reranker. Each search is opened as a link, as people share them."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.console.browser import chrome, fits, screenshot, wait
from tests.support import processes
from tests.support.model_server import ModelServer, running_model_server

ROOT = Path(__file__).resolve().parents[2]
SCORE_LINE = re.compile(
    r"^meaning \d\.\d{3} \(#\d+\) · (words \d+\.\d{2} \(#\d+\) · )?fused 0\.\d{4} · "
    r"reranker -?\d\.\d{3}$"
)
EVIL = (
    "# Xylophone notes\n\nThe xylophone room: <script>window.pwned = 1; "
    "document.title = 'pwned'</script> and <img src=x onerror=\"window.pwned = 2\">.\n"
)


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    with running_model_server() as server:
        yield server


@pytest.fixture(scope="module")
def indexer(
    model: ModelServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[processes.Process]:
    work = tmp_path_factory.mktemp("console")
    handbook = work / "handbook"
    shutil.copytree(ROOT / "examples" / "handbook", handbook)
    (handbook / "notes").mkdir()
    (handbook / "notes" / "xylophone.md").write_text(EVIL)
    p = processes.indexer({"handbook": handbook}, work / "index", model.base_url, model.base_url)
    with processes.running(p):
        processes.wait_ready(p)
        yield p


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    driver = chrome()
    yield driver
    driver.quit()


def open_search(driver: webdriver.Chrome, base_url: str, **params: str) -> None:
    driver.set_window_size(1280, 900)
    driver.get(f"{base_url}/?{urlencode(params)}")


def test_a_search_link_shows_cited_results_with_the_score_line(
    browser: webdriver.Chrome, indexer: processes.Process
) -> None:
    open_search(browser, indexer.base_url, q="How many holidays do I get?")
    results = browser.find_elements(By.CSS_SELECTOR, "ol.results > li.result")
    assert results, browser.page_source[-2000:]
    first = results[0]
    assert re.match(
        r"^handbook/policies/leave\.md, line \d+", first.find_element(By.CSS_SELECTOR, ".cite").text
    )
    assert first.find_element(By.CSS_SELECTOR, ".place").text.startswith("Leave policy")
    assert "holidays" in [m.text.lower() for m in browser.find_elements(By.TAG_NAME, "mark")]
    for r in results:
        line = r.find_element(By.CSS_SELECTOR, ".scores").text
        assert SCORE_LINE.match(line), line
    took = browser.find_element(By.CSS_SELECTOR, ".took").text
    assert re.search(r"hybrid, reranked: embed [\d.]+ ms · meaning .* total [\d.]+ ms", took)
    assert fits(browser)
    screenshot(browser, "search")


def test_compare_shows_the_three_ranks_and_why_each_came_up(
    browser: webdriver.Chrome, indexer: processes.Process
) -> None:
    open_search(browser, indexer.base_url, q="Xid 79 GPU fallen off the bus", compare="1")
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "table.compare th")]
    assert heads == ["Both", "Meaning", "Words", "Passage", "Why it came up"]
    rows = browser.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")
    assert rows
    first = [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")]
    assert first[:3] == ["1", "1", "1"]
    assert "handbook/runbooks/gpu-errors.txt" in first[3]
    assert re.match(
        r"^close in meaning \(#\d+\) and shares words \(#\d+\) — both agree; "
        r"the reranker scored it -?\d\.\d{3}$",
        first[4],
    ), first[4]
    cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
    assert any("— it says the same thing in other words" in c[4] for c in cells), cells
    for _, meaning, words, _, said in cells:  # one rank per thing: the columns' own
        by_meaning = re.search(r"close in meaning \(#(\d+)\)", said)
        by_words = re.search(r"shares words \(#(\d+)\)", said)
        assert (by_meaning.group(1) if by_meaning else "—") == meaning, (meaning, said)
        assert (by_words.group(1) if by_words else "—") == words, (words, said)
    marks = {m.text.lower() for m in browser.find_elements(By.CSS_SELECTOR, "table.compare mark")}
    assert "xid" in marks and "the" not in marks, marks
    screenshot(browser, "compare")


@pytest.mark.parametrize(
    ("question", "code", "message"),
    [
        ("", "QUERY_EMPTY", "the question is empty"),
        (
            "a" * 4001,
            "QUERY_TOO_LONG",
            "the question has 4001 characters; at most 4000 are allowed",
        ),
    ],
)
def test_a_refused_question_shows_the_specs_code_and_message(
    browser: webdriver.Chrome, indexer: processes.Process, question: str, code: str, message: str
) -> None:
    open_search(browser, indexer.base_url, q=question)
    error = browser.find_element(By.CSS_SELECTOR, "[role=alert]").text
    assert code in error and message in error
    assert not browser.find_elements(By.CSS_SELECTOR, "li.result")


def test_a_document_holding_a_script_is_shown_not_run(
    browser: webdriver.Chrome, indexer: processes.Process
) -> None:
    open_search(browser, indexer.base_url, q="xylophone", mode="keyword")
    snippet = browser.find_element(By.CSS_SELECTOR, "li.result .snippet").text
    assert "<script>window.pwned = 1;" in snippet
    assert "onerror" in snippet
    assert browser.execute_script("return window.pwned === undefined")
    assert "pwned" not in browser.title


def test_the_page_is_usable_by_keyboard_and_at_390_px(
    browser: webdriver.Chrome, indexer: processes.Process
) -> None:
    browser.set_window_size(390, 844)
    browser.get(f"{indexer.base_url}/")
    browser.find_element(By.TAG_NAME, "body").send_keys("/")
    box = browser.switch_to.active_element
    assert box.get_attribute("id") == "q"
    box.send_keys("hotel night cost", Keys.ENTER)
    wait(browser, "results after Enter", lambda d: d.find_elements(By.CSS_SELECTOR, "li.result"))
    assert "q=hotel+night+cost" in browser.current_url
    assert "handbook/travel.pdf, page" in browser.find_element(By.CSS_SELECTOR, ".cite").text
    assert fits(browser)
