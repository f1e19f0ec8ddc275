"""The chat page in headless Chromium (Debian's, driven by selenium through /usr/bin/chromedriver):
a question about the sample documents streams its answer with [n] links to the numbered
sources, over the websocket under ASGI and over server-sent events under WSGI; model output
that looks like HTML stays text."""

from __future__ import annotations

import os
import shutil

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from django_ragchat.models import Conversation, Message
from tests.live_servers import caller_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

QUESTION = "How much does the Aurora X2 cost?"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={profile}", "--window-size=1200,900"):
        options.add_argument(argument)
    # Chromium and its driver write scratch files to TMPDIR: pytest's directory, not /tmp.
    scratch = tmp_path_factory.mktemp("chromium-tmp")
    service = Service(executable_path="/usr/bin/chromedriver", env={**os.environ, "TMPDIR": str(scratch)})
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser):
    """The browser with no cookies left from an earlier test."""
    browser.delete_all_cookies()
    return browser


def ask(driver, question: str) -> None:
    """Type ``question``, send it and wait until its answer has ended."""
    before = len(driver.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    box = driver.find_element(By.ID, "ragchat-input")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.ID, "ragchat-send").click()
    wait = WebDriverWait(driver, 20)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")) > before)
    wait.until(lambda d: d.execute_script(
        "return document.getElementById('ragchat-stop').hidden"
        " && !document.getElementById('ragchat-send').disabled"))


def wait_for_page(driver) -> None:
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && document.getElementById('ragchat-form') !== null"))


def last_answer(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")[-1]


def stream_requests(driver) -> list[str]:
    """URLs of the server-sent events requests the page made."""
    return driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/stream/'))")


def check_cited_answer(driver) -> None:
    answer = last_answer(driver)
    body = answer.find_element(By.CSS_SELECTOR, ".ragchat-body")
    assert "$699" in body.text
    sources = answer.find_elements(By.CSS_SELECTOR, ".ragchat-sources > li")
    assert sources and "Aurora X2" in sources[0].text
    links = body.find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    assert links, body.text
    source_ids = {s.get_attribute("id") for s in sources}
    for link in links:
        target = link.get_attribute("href").split("#", 1)[1]
        assert target in source_ids and f"[{link.text}]" in body.text
    links[0].click()  # a citation takes the reader to its source
    assert driver.execute_script("return location.hash") == "#" + links[0].get_attribute("href").split("#", 1)[1]
    cited = answer.find_elements(By.CSS_SELECTOR, ".ragchat-source-cited")
    assert cited


def test_the_page_streams_a_cited_answer_over_the_websocket_under_asgi(page, asgi, product_corpus):
    page.get(f"{asgi.url}/chat/")
    wait_for_page(page)
    ask(page, QUESTION)
    check_cited_answer(page)
    assert stream_requests(page) == []  # the websocket carried it
    session_key = page.get_cookie("sessionid")["value"]
    conversation = Conversation.objects.get(session_key=session_key)  # anonymous, bound to the session
    assert conversation.title == QUESTION
    assert list(conversation.messages.values_list("role", "status")) == [("user", "complete"), ("assistant", "complete")]
    # The sidebar lists it; after a reload its history shows the same links.
    page.refresh()
    wait_for_page(page)
    WebDriverWait(page, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open").text == QUESTION
    check_cited_answer(page)


def test_a_second_tab_on_the_conversation_shows_the_answer_live(page, asgi, product_corpus):
    first_tab = page.current_window_handle
    page.get(f"{asgi.url}/chat/")
    wait_for_page(page)
    ask(page, QUESTION)
    page.switch_to.new_window("tab")  # same browser, same session: the conversation opens there too
    page.get(f"{asgi.url}/chat/")
    wait_for_page(page)
    WebDriverWait(page, 20).until(lambda d: d.execute_script(
        "return document.getElementById('ragchat-log').dataset.live === 'websocket'"
        " && document.querySelectorAll('.ragchat-message').length === 2"))
    second_tab = page.current_window_handle
    page.switch_to.window(first_tab)
    ask(page, "How much does the 256 GB model cost?")
    page.switch_to.window(second_tab)
    WebDriverWait(page, 20).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-message")) == 4
                                  and "$799" in last_answer(d).text)
    bodies = [b.text for b in page.find_elements(By.CSS_SELECTOR, ".ragchat-body")]
    assert bodies[2] == "How much does the 256 GB model cost?"  # the question typed in the other tab
    assert last_answer(page).find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    page.close()
    page.switch_to.window(first_tab)


def test_stop_in_one_tab_stops_the_answer_another_tab_asked_for(page, asgi, product_corpus, openai_server):
    openai_server.token_delay = 0.05
    openai_server.when("", " ".join(f"word{i}" for i in range(200)))
    page.get(f"{asgi.url}/chat/")
    wait_for_page(page)
    conversation = Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], profile="fake")
    page.refresh()
    first_tab = page.current_window_handle
    page.switch_to.new_window("tab")
    page.get(f"{asgi.url}/chat/")
    for tab in (page.current_window_handle, first_tab):  # both tabs live on the conversation
        page.switch_to.window(tab)
        wait_for_page(page)
        WebDriverWait(page, 20).until(lambda d: d.execute_script(
            "return document.getElementById('ragchat-log').dataset.live === 'websocket'"))
    second_tab = page.window_handles[-1]
    box = page.find_element(By.ID, "ragchat-input")
    box.send_keys(QUESTION)
    page.find_element(By.ID, "ragchat-send").click()  # asked in the first tab
    page.switch_to.window(second_tab)
    WebDriverWait(page, 20).until(lambda d: "word3" in d.execute_script(
        "const a = document.querySelectorAll('.ragchat-assistant'); return a.length ? a[a.length - 1].textContent : ''"))
    page.find_element(By.ID, "ragchat-stop").click()  # stopped from the second
    for tab in (second_tab, first_tab):
        page.switch_to.window(tab)
        WebDriverWait(page, 20).until(lambda d: "Stopped before the end." in last_answer(d).text)
        assert page.find_element(By.ID, "ragchat-send").is_enabled()
    answer = Message.objects.get(conversation=conversation, role="assistant")
    assert answer.status == "incomplete" and answer.content.startswith("word0 word1 word2 word3")
    page.switch_to.window(second_tab)
    page.close()
    page.switch_to.window(first_tab)


def test_the_page_streams_a_cited_answer_over_server_sent_events_under_wsgi(page, live_server, product_corpus, user):
    page.get(f"{live_server.url}/chat/")  # a page of the site, to be allowed to set its cookie
    page.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    page.get(f"{live_server.url}/chat/")
    wait_for_page(page)
    ask(page, QUESTION)
    check_cited_answer(page)
    assert len(stream_requests(page)) == 1
    assert Conversation.objects.get().owner == user


XSS = 'Look: <img src=x onerror="window.__xss=1"> and <script>window.__xss=2</script> done [1]'


def test_model_output_and_questions_are_shown_as_text_never_as_html(page, asgi, product_corpus, openai_server):
    openai_server.when("", XSS)
    page.get(f"{asgi.url}/chat/")
    wait_for_page(page)
    session_key = page.get_cookie("sessionid")["value"]
    Conversation.objects.create(session_key=session_key, profile="fake", title="<b>title</b>")
    page.refresh()
    wait_for_page(page)
    WebDriverWait(page, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open"))
    question = "What is <img src=y onerror=window.__xss=3>?"
    ask(page, question)

    def check():
        log = page.find_element(By.ID, "ragchat-log")
        bodies = [b.text for b in log.find_elements(By.CSS_SELECTOR, ".ragchat-body")]
        assert bodies[-2:] == [question, XSS]
        assert log.find_elements(By.CSS_SELECTOR, "img, script, b") == []
        assert page.find_element(By.CSS_SELECTOR, ".ragchat-conversation").text == "<b>title</b>"
        assert page.execute_script("return window.__xss === undefined")

    check()
    assert Message.objects.get(role="assistant").content == XSS
    page.refresh()  # the saved history renders the same way
    wait_for_page(page)
    WebDriverWait(page, 20).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-body")) >= 2)
    check()


@pytest.mark.parametrize("page_name", ["docs", "redoc"])
def test_the_api_docs_render_from_the_sites_own_static_files(page, live_server, page_name):
    """Swagger UI and Redoc come from drf-spectacular-sidecar through the site's static files:
    the pages render their operations with no network, and load nothing from another origin."""
    page.get(f"{live_server.url}/api/ragchat/{page_name}/")
    selector = ".swagger-ui .opblock-summary-path" if page_name == "docs" else "[data-section-id^='operation/']"
    WebDriverWait(page, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, selector))
    if page_name == "docs":
        paths = {e.text.replace("\u200b", "") for e in page.find_elements(By.CSS_SELECTOR, selector)}
        assert "/api/ragchat/conversations/" in paths
    else:
        assert "conversation" in page.find_element(By.TAG_NAME, "body").text.lower()
    # Scripts, stylesheets and the schema (Redoc's own footer logo is an image from its site).
    resources = page.execute_script("return performance.getEntriesByType('resource')"
                                    ".filter(e => e.initiatorType !== 'img').map(e => e.name)")
    assert any("/static/drf_spectacular_sidecar/" in url for url in resources), resources
    assert all(url.startswith(live_server.url) for url in resources), resources
