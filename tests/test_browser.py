"""The chat widget in headless Chromium (Debian's, driven by selenium through /usr/bin/chromedriver).

The chat page is ``{% ragchat_widget %}`` on a page of its own. These tests use it as a person
would: a question streams its answer token by token with [n] links to the numbered sources,
over the websocket under ASGI (uvicorn) and over server-sent events under WSGI (gunicorn); Stop and Escape stop it;
the history comes back on reload; feedback is saved; refusals and failures are shown, with
Retry; model output and documents that look like HTML stay text.

Each test saves a screenshot under ``var/screenshots/`` (git-ignored). With
``RAGCHAT_DOC_IMAGES=1`` the streaming test also writes ``docs/images/chat-widget.png`` (the
README's picture).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from django_ragchat.models import Conversation, Feedback, Message
from django_ragchat.text import shorten
from django_ragchat.turn import limits
from tests.live_servers import caller_for, chromium

# pairwise: on Django 5.x with PostgreSQL and 6.x with SQLite in scripts/test.sh (pyproject.toml).
pytestmark = [pytest.mark.browser, pytest.mark.pairwise, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "var" / "screenshots"
#: The refusal states at 1280x800, to look at (RAGCHAT_SHOTS overrides where).
SHOTS = Path(os.environ.get("RAGCHAT_SHOTS", SCREENSHOTS))
QUESTION = "How much does the Aurora X2 cost?"


@pytest.fixture(scope="module")
def browser():
    with chromium(window="1200,900") as driver:
        yield driver


@pytest.fixture
def page(browser, request):
    """The browser with no cookies left from an earlier test; a screenshot of the page when the
    test ends (passed or failed)."""
    browser.delete_all_cookies()
    browser.set_window_size(1200, 900)
    yield browser
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / f"{request.node.name}.png"))


def wait(driver, condition, timeout: float = 20):
    return WebDriverWait(driver, timeout).until(condition)


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def open_chat(driver, url: str) -> None:
    """Load the chat page and wait until the widget is mounted and has its conversations."""
    driver.get(url)
    wait(driver, lambda d: js(d, "const w = document.querySelector('.ragchat');"
                                 " return document.readyState === 'complete' && w && w.dataset.ready === 'true'"))


def idle(driver) -> bool:
    return js(driver, "const w = document.querySelector('.ragchat');"
                      " return w.querySelector('.ragchat-stop').hidden && !w.querySelector('.ragchat-send').disabled")


def type_question(driver, question: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, ".ragchat-input")
    box.clear()
    box.send_keys(question)


def ask(driver, question: str) -> None:
    """Type ``question``, send it and wait until its answer has ended."""
    before = len(driver.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    type_question(driver, question)
    driver.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")) > before)
    wait(driver, idle)


def last_answer(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")[-1]


def last_answer_text(driver) -> str:
    return js(driver, "const a = document.querySelectorAll('.ragchat-assistant .ragchat-body');"
                      " return a.length ? a[a.length - 1].textContent : ''")


def stream_requests(driver) -> list[str]:
    """URLs of the server-sent events requests the page made."""
    return js(driver, "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('stream/'))")


def check_cited_answer(driver, expected: str = "$699") -> None:
    answer = last_answer(driver)
    body = answer.find_element(By.CSS_SELECTOR, ".ragchat-body")
    assert expected in body.text
    sources = answer.find_elements(By.CSS_SELECTOR, ".ragchat-sources > li")
    assert sources and "Aurora X2" in sources[0].text
    links = body.find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    assert links, body.text
    source_ids = {s.get_attribute("id") for s in sources}
    for link in links:
        target = link.get_attribute("href").split("#", 1)[1]
        assert target in source_ids and f"[{link.text}]" in body.text
    links[0].click()  # a citation takes the reader, and the focus, to its source
    target = links[0].get_attribute("href").split("#", 1)[1]
    assert js(driver, "return location.hash") == "#" + target
    wait(driver, lambda d: js(d, "return document.activeElement.id") == target)
    assert answer.find_elements(By.CSS_SELECTOR, ".ragchat-source-cited")
    # Each source once, its heading once, its excerpt cut at a word boundary.
    for source in sources:
        title = source.find_element(By.CSS_SELECTOR, ".ragchat-source-title").text
        headings = source.find_elements(By.CSS_SELECTOR, ".ragchat-source-heading")
        snippet = source.find_element(By.CSS_SELECTOR, ".ragchat-source-snippet").text
        for heading in headings:
            assert heading.text and heading.text not in snippet and title not in heading.text
    indexes = [s.get_attribute("value") for s in sources]
    assert len(indexes) == len(set(indexes))


def test_a_new_conversation_streams_a_cited_answer_over_the_websocket_and_comes_back_on_reload(
        page, asgi, product_corpus):
    open_chat(page, f"{asgi.url}/chat/")
    assert not Conversation.objects.exists()  # nothing is created before a message is accepted
    ask(page, QUESTION)
    check_cited_answer(page)
    assert stream_requests(page) == []  # the websocket carried it
    session_key = page.get_cookie("sessionid")["value"]
    conversation = Conversation.objects.get(session_key=session_key)  # anonymous, bound to the session
    wait(page, lambda d: Conversation.objects.get(pk=conversation.pk).title == QUESTION)  # named after it
    assert list(conversation.messages.values_list("role", "status")) == [("user", "complete"), ("assistant", "complete")]
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open .ragchat-conversation-title").text == QUESTION
    # After a reload the sidebar lists it and its history shows the same links.
    page.refresh()
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open .ragchat-conversation-title").text == QUESTION
    check_cited_answer(page)


def sources_shown(answer) -> tuple[list[int], set[int]]:
    """The numbers of the answer's sources as listed, and those marked cited."""
    items = answer.find_elements(By.CSS_SELECTOR, ".ragchat-sources > li")
    numbers = [int(i.get_attribute("value")) for i in items]
    return numbers, {n for n, i in zip(numbers, items) if "ragchat-source-cited" in i.get_attribute("class")}


def test_the_sources_read_in_number_order_the_cited_marked_and_a_decline_says_it_cited_none(
        page, asgi, product_corpus):
    open_chat(page, f"{asgi.url}/chat/")
    ask(page, "Is the Aurora X2 waterproof?")  # the documents don't say: nothing is cited
    answer = last_answer(page)
    assert "don't say" in answer.find_element(By.CSS_SELECTOR, ".ragchat-body").text
    label = answer.find_element(By.CSS_SELECTOR, ".ragchat-sources-label")
    assert label.text.lower() == "searched, none cited"
    assert not answer.find_elements(By.CSS_SELECTOR, ".ragchat-source-cited")
    ask(page, "How much are the Nimbus Tab and its stylus together?")
    for reloaded in (False, True):  # as the turn ended, and from the history after a reload
        if reloaded:
            page.refresh()
            open_chat(page, f"{asgi.url}/chat/")
            wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")) == 2)
        answer = last_answer(page)
        assert "$529" in answer.find_element(By.CSS_SELECTOR, ".ragchat-body").text
        assert answer.find_element(By.CSS_SELECTOR, ".ragchat-sources-label").text.lower() == "sources"
        # 1, 2, 3, 4 whichever are cited (not the cited first: 2, 1, 3, 4), the cited marked.
        numbers, cited = sources_shown(answer)
        assert numbers == sorted(numbers) and len(numbers) > 1, numbers
        assert cited and cited != set(numbers[:len(cited)]), (numbers, cited)  # a cited one after one not
        badges = answer.find_elements(By.CSS_SELECTOR, ".ragchat-source-cited .ragchat-source-badge")
        assert len(badges) == len(cited) and all(b.text.lower() == "cited" for b in badges)
        links = answer.find_elements(By.CSS_SELECTOR, ".ragchat-body a.ragchat-cite")
        assert links and {int(link.text) for link in links} <= cited
    js(page, "arguments[0].scrollIntoView({block: 'start'})", answer)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    answer.screenshot(str(SCREENSHOTS / "chat-sources-in-number-order.png"))


ANSWER = ("The **Aurora X2** costs $699 with 128 GB of storage [1].\n\n"
          "- The 256 GB model costs $799 [1].\n- Both have a `48 MP` camera [1].\n\n"
          "Ask me about the Nimbus Tab next.")


def test_the_answer_grows_token_by_token_then_shows_its_citations(page, asgi, product_corpus, openai_server):
    openai_server.token_delay = 0.06
    openai_server.when("", ANSWER)
    open_chat(page, f"{asgi.url}/chat/")
    conversation = Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], profile="fake",
                                               title="Aurora X2 prices")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open"))
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    # Record the answer's length each time it changes, and what the widget said it was doing.
    js(page, """
        window.__lengths = []; window.__stages = new Set();
        new MutationObserver(() => {
          const a = document.querySelectorAll('.ragchat-assistant');
          if (!a.length) return;
          const last = a[a.length - 1];
          const n = last.querySelector('.ragchat-body').textContent.length;
          if (window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
          const p = last.querySelector('.ragchat-progress');
          if (!p.hidden) window.__stages.add(p.textContent);
        }).observe(document.querySelector('.ragchat-log'), {subtree: true, childList: true, characterData: true,
                                                            attributes: true});
    """)
    openai_server.hold_streams(after_tokens=4)  # the model pauses mid-answer until released
    type_question(page, QUESTION)
    page.find_element(By.CSS_SELECTOR, ".ragchat-input").send_keys(Keys.ENTER)  # Enter sends
    wait(page, lambda d: last_answer_text(d) and not idle(d))
    partial = last_answer_text(page)
    assert 0 < len(partial) < len(ANSWER) // 2 and "[1]" not in partial, partial
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-stop").is_displayed()  # Stop shown meanwhile
    assert last_answer(page).get_attribute("aria-busy") == "true"
    # The sources came before the first token; the citations become links once written.
    assert last_answer(page).find_elements(By.CSS_SELECTOR, ".ragchat-sources > li")
    assert not last_answer(page).find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    openai_server.release_streams()
    wait(page, idle)
    lengths = js(page, "return window.__lengths")
    assert len([n for n in lengths if 0 < n < len(ANSWER) - 30]) >= 3, lengths  # grew piece by piece
    stages = js(page, "return [...window.__stages]")
    assert "Writing the answer…" in stages and "Searching the documents…" in stages, stages
    answer = last_answer(page)
    body = answer.find_element(By.CSS_SELECTOR, ".ragchat-body")
    assert body.find_element(By.CSS_SELECTOR, "strong").text == "Aurora X2"  # Markdown, rendered safely
    assert [li.text for li in body.find_elements(By.CSS_SELECTOR, "ul > li")][0] == "The 256 GB model costs $799 [1]."
    assert body.find_element(By.CSS_SELECTOR, "code").text == "48 MP"
    check_cited_answer(page)
    saved = Message.objects.get(conversation=conversation, role="assistant")
    assert saved.status == "complete" and saved.content == ANSWER
    js(page, "document.activeElement.blur(); location.hash = ''; "
             "document.querySelectorAll('.ragchat-source-current').forEach(e => e.classList.remove('ragchat-source-current'))")
    page.execute_script("document.querySelector('.ragchat-log').scrollTop = 0")
    if os.environ.get("RAGCHAT_DOC_IMAGES"):
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        assert page.save_screenshot(str(ROOT / "docs" / "images" / "chat-widget.png"))


def test_stop_mid_answer_marks_it_incomplete_and_escape_stops_too(page, asgi, product_corpus, openai_server):
    openai_server.token_delay = 0.05
    openai_server.when("", " ".join(f"word{i}" for i in range(300)))
    open_chat(page, f"{asgi.url}/chat/")
    conversation = Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], profile="fake")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    for stop_with in ("button", "escape"):
        type_question(page, QUESTION)
        page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
        wait(page, lambda d: "word3" in last_answer_text(d))
        if stop_with == "button":
            page.find_element(By.CSS_SELECTOR, ".ragchat-stop").click()
        else:
            page.find_element(By.CSS_SELECTOR, ".ragchat-input").send_keys(Keys.ESCAPE)
        wait(page, lambda d: "Stopped before the end." in last_answer(d).text)
        wait(page, idle)
        text = last_answer_text(page)
        assert text.startswith("word0 word1 word2 word3") and "word299" not in text
    answers = Message.objects.filter(conversation=conversation, role="assistant").order_by("seq")
    assert [a.status for a in answers] == ["incomplete", "incomplete"]
    page.refresh()  # the history says so too
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")) == 2)
    assert all("Stopped before the end." in a.text for a in page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))


def test_feedback_with_a_comment_is_saved_and_shown_again(page, asgi, product_corpus):
    open_chat(page, f"{asgi.url}/chat/")
    ask(page, QUESTION)
    answer = last_answer(page)
    down = answer.find_element(By.CSS_SELECTOR, ".ragchat-rate-down")
    assert down.get_attribute("aria-label") == "Bad answer" and down.get_attribute("aria-pressed") == "false"
    down.click()
    wait(page, lambda d: Feedback.objects.filter(rating="down").exists())
    wait(page, lambda d: down.get_attribute("aria-pressed") == "true")
    box = answer.find_element(By.CSS_SELECTOR, ".ragchat-comment-input")
    box.send_keys("It should say <b>which</b> storage.")
    answer.find_element(By.CSS_SELECTOR, ".ragchat-comment-save").click()
    wait(page, lambda d: Feedback.objects.filter(comment__startswith="It should").exists())
    feedback = Feedback.objects.get()
    message = Message.objects.get(role="assistant")
    assert (feedback.message_id, feedback.rating, feedback.comment, feedback.user) == (
        message.pk, "down", "It should say <b>which</b> storage.", None)
    assert feedback.session_key == page.get_cookie("sessionid")["value"]
    # Changing your mind updates the one rating.
    answer.find_element(By.CSS_SELECTOR, ".ragchat-rate-up").click()
    wait(page, lambda d: Feedback.objects.get().rating == "up")
    assert Feedback.objects.count() == 1
    page.refresh()
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-rate-up[aria-pressed='true']"))
    assert last_answer(page).find_element(By.CSS_SELECTOR, ".ragchat-comment-input").get_attribute("value") == \
        "It should say <b>which</b> storage."
    # Pressed again: withdrawn.
    last_answer(page).find_element(By.CSS_SELECTOR, ".ragchat-rate-up").click()
    wait(page, lambda d: not Feedback.objects.exists())


def message_limit(driver) -> int:
    """``MAX_MESSAGE_CHARS`` as the page's widget was told it (its JSON config)."""
    return js(driver, "return JSON.parse(document.querySelector('script[id$=\"-config\"]').textContent)"
                      ".maxMessageChars")


def status_line(driver) -> dict:
    """What the status line shows, and what it says to screen readers only."""
    return js(driver, """
        const status = document.querySelector('.ragchat-status');
        return {shown: Array.from(status.childNodes).filter((n) => n.nodeType === Node.TEXT_NODE)
                  .map((n) => n.textContent).join('').trim(),
                heard: Array.from(status.querySelectorAll('.ragchat-visually-hidden'), (s) => s.textContent).join(' ')};""")


def seen_text(driver) -> str:
    """The widget's text as seen, without what is said to screen readers only."""
    return js(driver, """const shown = document.querySelector('.ragchat').cloneNode(true);
        shown.querySelectorAll('.ragchat-visually-hidden').forEach((n) => n.remove());
        return shown.textContent;""")


def check_refusal_shown(driver, *, text: str) -> None:
    """The refused question says why; the status line says it to screen readers only, whether
    a retry may work or not: shown once."""
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-user.ragchat-refused"))
    wait(driver, idle)  # not hanging: Send works, Stop is gone
    refused = driver.find_elements(By.CSS_SELECTOR, ".ragchat-user.ragchat-refused")[-1]
    assert text in refused.find_element(By.CSS_SELECTOR, ".ragchat-note").text
    status = status_line(driver)
    assert not status["shown"] and text in status["heard"], status
    assert seen_text(driver).count(text) == 1
    assert not driver.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")  # no "…" left waiting


def spend_the_rate_limit(session: str, prefix: str, wait: float = 4.5) -> None:
    """Count turns in the one bucket that is leaving the window ``wait`` s from now, enough for
    the live servers' TURNS_PER_MINUTE (25) to refuse a turn for ``wait`` s to about ``wait`` +
    0.4 s: the sliding window lets one in once that bucket weighs 24 or less (its p turns
    weigh p * (1 - elapsed / RATE_BUCKET_SECONDS) then, elapsed in the bucket that follows the
    window's whole ones). Before then the bucket counts whole, or weighs more: refused."""
    import math
    import time

    import redis

    from tests.live_servers import REDIS_URL

    size = limits.RATE_BUCKET_SECONDS
    bucket, elapsed = divmod(time.time() + wait, size)
    leaving = int(bucket) - limits.RATE_WINDOW_SECONDS // size
    spent = max(25, math.ceil(24 / (1 - elapsed / size)))
    client = redis.Redis.from_url(REDIS_URL)
    client.set(f"{prefix}:1:ragchat:rate:s{session}:{leaving}", spent, ex=180)
    client.close()


def wait_shown(driver) -> str:
    return js(driver, "const w = document.querySelector('.ragchat-refused .ragchat-wait'); return w ? w.textContent : ''")


def test_a_rate_limited_message_counts_down_the_wait_and_is_sent_again_by_retry(
        page, asgi, product_corpus, live_prefix):
    """The refusal names the wait the server asks for (``retry_after``) and counts it down, once a
    second, silently for screen readers; at 0 it says so and Retry stands out, sending nothing by
    itself; Retry then sends it, the server's wait being over."""
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    spend_the_rate_limit(page.get_cookie("sessionid")["value"], live_prefix)
    type_question(page, QUESTION)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    check_refusal_shown(page, text="Too many messages")
    note = page.find_elements(By.CSS_SELECTOR, ".ragchat-user.ragchat-refused .ragchat-note")[-1]
    seconds = int(wait_shown(page).split("Try again in ")[1].split(" s.")[0])
    assert 3 <= seconds <= 8, note.text
    assert note.text.startswith("Not sent: Too many messages") and "Try again in" in note.text
    assert note.find_element(By.CSS_SELECTOR, ".ragchat-wait").get_attribute("aria-live") == "off"
    retry = page.find_element(By.CSS_SELECTOR, ".ragchat-refused .ragchat-retry")
    assert "ragchat-retry-ready" not in retry.get_attribute("class")
    assert not retry.get_attribute("title")  # no second number, that would not count down
    # Down a second at a time, then ready: nothing sent by itself.
    wait(page, lambda d: wait_shown(d) == f"Try again in {seconds - 1} s.", timeout=2.5)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(SCREENSHOTS / "refusal-counting-down.png"))
    wait(page, lambda d: wait_shown(d) == "You can try again now.", timeout=seconds + 1)
    page.save_screenshot(str(SCREENSHOTS / "refusal-wait-over.png"))
    assert "ragchat-retry-ready" in retry.get_attribute("class")
    # Said on the status line, shown on the question only (it was shown on both).
    assert status_line(page) == {"shown": "", "heard": "You can try again now."}
    assert seen_text(page).count("You can try again now.") == 1
    assert js(page, "return document.querySelector('.ragchat').ragchat.waits.size") == 0
    assert len(page.find_elements(By.CSS_SELECTOR, ".ragchat-user")) == 1 and not Conversation.objects.exists()
    # Retry sends it, the server's wait over: the question stands once, answered.
    retry.click()
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    wait(page, idle)
    assert "$699" in last_answer_text(page)
    assert len(page.find_elements(By.CSS_SELECTOR, ".ragchat-user")) == 1
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-refused")


def show_at_1280x800(driver) -> None:
    """A viewport of 1280x800 (the window's own bars come on top), for the screenshots to look at."""
    driver.set_window_size(1280, 800)
    bars = 800 - js(driver, "return window.innerHeight")
    driver.set_window_size(1280, 800 + bars)


def waits_said(driver) -> dict:
    """In one script (one instant): the status line's text, the waits it says (heard, not seen)
    and the count on the refused question."""
    return js(driver, """
        const status = document.querySelector('.ragchat-status');
        const count = document.querySelector('.ragchat-refused .ragchat-wait');
        return {status: status.textContent, count: count ? count.textContent : '',
                heard: Array.from(status.querySelectorAll('.ragchat-visually-hidden'), (s) => s.textContent)};""")


def test_the_status_line_says_the_wait_once_and_never_a_number_the_count_has_left(
        page, asgi, product_corpus, live_prefix):
    """One wait on the page: the status line says it once for screen readers, from the deadline
    the count reads (the same number then), and holds no number once the count has moved on:
    it said "Try again in 62 s." while the message counted "60 s" (found by a new user)."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    spend_the_rate_limit(page.get_cookie("sessionid")["value"], live_prefix)
    type_question(page, QUESTION)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    wait(page, lambda d: wait_shown(d).startswith("Try again in"))
    refused = "Too many messages: at most 25 a minute."
    said = waits_said(page)
    # Heard at most once, the same number as the count (unless the first tick already took it),
    # after the refusal; all of it heard only: the question shows it, and counts the wait.
    assert said["heard"] in ([refused, said["count"]], [refused]), said
    assert said["status"] in (f"{refused} {said['count']}", refused), said
    assert status_line(page)["shown"] == ""
    seconds = int(said["count"].split("Try again in ")[1].split(" s.")[0])
    wait(page, lambda d: wait_shown(d) == f"Try again in {seconds - 1} s.", timeout=2.5)
    page.save_screenshot(str(SHOTS / "1-refused-counting-down.png"))
    # Counting: the status line keeps the refusal, with no second, stale number.
    said = waits_said(page)
    assert said["status"] == refused and said["heard"] == [refused], said
    assert seen_text(page).count(refused) == 1
    wait(page, lambda d: wait_shown(d) == "You can try again now.", timeout=seconds + 1)
    page.save_screenshot(str(SHOTS / "2-refused-wait-over.png"))
    assert status_line(page) == {"shown": "", "heard": "You can try again now."}


def test_a_question_sent_again_by_hand_replaces_its_refused_copy(page, asgi, product_corpus, live_prefix):
    """Sent again from the box (not by Retry) once the wait is over, and accepted: the refused
    copy goes, with its Retry, so the question stands once and cannot be sent twice (it stayed,
    Retry active: found by a new user). The new conversation is named after the question, cut
    at a word boundary (it was cut mid-word at 80 characters)."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    spend_the_rate_limit(page.get_cookie("sessionid")["value"], live_prefix)
    question = "How much does the Aurora X2 cost, and is the price the same in each of the colours it comes in?"
    assert question[79:81].isalpha()  # 80 characters end mid-word
    type_question(page, question)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    check_refusal_shown(page, text="Too many messages")
    wait(page, lambda d: wait_shown(d) == "You can try again now.", timeout=8)
    # Typed again (the box kept it) and sent with Send, not Retry.
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-input").get_attribute("value") == question
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    wait(page, idle)
    page.save_screenshot(str(SHOTS / "3-sent-again-by-hand.png"))
    assert "$699" in last_answer_text(page)
    assert len(page.find_elements(By.CSS_SELECTOR, ".ragchat-user")) == 1
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-refused")
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-user .ragchat-retry")
    assert js(page, "return document.querySelector('.ragchat').ragchat.waits.size") == 0
    title = shorten(question, 80)
    assert title.endswith(" in each of the…"), title  # not "…of the colou"
    wait(page, lambda d: d.find_element(By.CSS_SELECTOR, ".ragchat-conversation-title").text == title)
    wait(page, lambda d: Conversation.objects.get().title == title)


def test_an_untitled_conversation_is_listed_by_its_first_question(page, asgi, product_corpus):
    """Conversations started through the REST API have no title: the list names them by their
    first question (the API's ``label``), not "Conversation of <date>" each (found by a new user)."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    session = page.get_cookie("sessionid")["value"]
    asked = Conversation.objects.create(session_key=session, profile="fake")
    Message.objects.create(conversation=asked, seq=1, role="user", content="<b>Which</b> colours does the Aurora X2 come in?")
    Message.objects.create(conversation=asked, seq=2, role="user", content="And the price?")
    Conversation.objects.create(session_key=session, profile="fake")  # nothing asked yet
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation")) == 2)
    labels = [e.text for e in page.find_elements(By.CSS_SELECTOR, ".ragchat-conversation-title")]
    assert "<b>Which</b> colours does the Aurora X2 come in?" in labels, labels
    assert any(label.startswith("Conversation of ") for label in labels), labels
    page.save_screenshot(str(SHOTS / "4-untitled-conversations-listed.png"))


def test_a_long_label_shows_two_lines_of_its_question_and_the_rest_on_hover(page, asgi):
    """One line of the list's width held about 25 characters of a question."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    question = "How long is the warranty on the Nimbus Tab if I bought it second-hand from a friend?"
    Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], title=question)
    open_chat(page, f"{asgi.url}/chat/")
    entry = wait(page, lambda d: d.find_element(By.CSS_SELECTOR, ".ragchat-conversation"))
    shown = js(page, """const span = arguments[0].querySelector('span');
        const lines = Math.round(span.getBoundingClientRect().height / parseFloat(getComputedStyle(span).lineHeight));
        return {lines, cut: span.scrollHeight > span.clientHeight, wide: arguments[0].scrollWidth <= arguments[0].clientWidth};""",
               entry)
    assert shown == {"lines": 2, "cut": True, "wide": True}, shown
    assert entry.get_attribute("title") == question and entry.text.startswith("How long is the warranty on the Nimbus")
    page.save_screenshot(str(SHOTS / "4-long-label-two-lines.png"))


def test_a_wait_being_counted_stops_with_retry_or_another_conversation(page, asgi, product_corpus, live_prefix):
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    spend_the_rate_limit(page.get_cookie("sessionid")["value"], live_prefix, wait=8)
    type_question(page, QUESTION)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    # Pressed (and the click handled) in one script: the count is stopped before anything else runs.
    press = "document.querySelector(arguments[0]).click(); return document.querySelector('.ragchat').ragchat.waits.size"
    wait(page, lambda d: wait_shown(d).startswith("Try again in"))
    assert js(page, press, ".ragchat-refused .ragchat-retry") == 0
    # Sent again within the wait: refused again, counting again, in the one bubble.
    wait(page, lambda d: wait_shown(d).startswith("Try again in"))
    assert len(page.find_elements(By.CSS_SELECTOR, ".ragchat-user")) == 1
    assert js(page, press, ".ragchat-new") == 0
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-user")


def test_a_refused_first_message_is_shown_as_an_error_and_creates_nothing(page, asgi, product_corpus, settings):
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    # The box cuts nothing (a maxLength cut a new user's 100 KB paste silently and sent the rest):
    # the server refuses what is too long, and the text stays in the box to be shortened.
    assert js(page, "return document.querySelector('.ragchat-input').maxLength") == -1
    limit = message_limit(page)
    js(page, "document.querySelector('.ragchat-input').value = arguments[0]", "x" * (limit + 1))
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    check_refusal_shown(page, text="the limit is")
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-input").get_attribute("value") == "x" * (limit + 1)
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-refused .ragchat-retry")  # it must change first
    assert not Conversation.objects.exists() and not page.find_elements(By.CSS_SELECTOR, ".ragchat-conversation")
    # Fixed, it goes.
    page.find_element(By.CSS_SELECTOR, ".ragchat-input").clear()
    ask(page, QUESTION)
    assert "$699" in last_answer_text(page)
    assert Conversation.objects.count() == 1
    # In a conversation that exists, a refusal is shown the same way and saves nothing.
    js(page, "document.querySelector('.ragchat-input').value = arguments[0]", "z" * (limit + 1))
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-refused")) == 2)
    wait(page, idle)
    assert "characters" in page.find_elements(By.CSS_SELECTOR, ".ragchat-refused .ragchat-note")[-1].text
    assert Message.objects.count() == 2


def test_a_question_a_guardrail_refused_does_not_name_the_conversation(page, asgi, product_corpus):
    """A new user's helpdesk: an input guardrail refused "password: Hunter2-xyz", and the widget
    named the conversation after it (a PATCH of its title as soon as the server accepted it), so
    the password stood in the list, the admin and the API. Now the widget names a conversation
    once its answer is saved, after the API's label, which is never a refused question: the
    entry goes back to its date, and the next question answered names it."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    ask(page, "password: Hunter2-xyz")
    assert last_answer_text(page) == "I can't help with that request."
    entry = page.find_element(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open")
    wait(page, lambda d: entry.text.startswith("Conversation of "))
    assert "Hunter2" not in entry.get_attribute("title")
    assert Conversation.objects.get().title == ""
    page.save_screenshot(str(SHOTS / "8-refused-question-does-not-name.png"))
    ask(page, QUESTION)  # answered: it names the conversation
    wait(page, lambda d: Conversation.objects.get().title == QUESTION)
    assert shown(page, ".ragchat-conversation-title") == [QUESTION]
    open_chat(page, f"{asgi.url}/chat/")  # read again from the API
    wait(page, lambda d: shown(d, ".ragchat-conversation-title") == [QUESTION])
    assert "Hunter2" not in page.find_element(By.CSS_SELECTOR, ".ragchat-conversations").get_attribute("textContent")


@pytest.mark.parametrize("served", ["asgi", "wsgi"])
def test_a_message_of_only_spaces_is_refused_with_a_reason_not_dropped_in_silence(page, request, served,
                                                                                 product_corpus, user):
    """A new user's helpdesk: a message of only spaces did nothing, with no message, where a
    message too long is shown refused with the reason. It is sent and refused as the server
    refuses it (400 ``empty``), over the websocket and server-sent events alike; nothing saved."""
    server = request.getfixturevalue(served)
    show_at_1280x800(page)
    if served == "wsgi":  # no anonymous chat there: signed in
        page.get(f"{server.url}/chat/")
        page.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    open_chat(page, f"{server.url}/chat/")
    type_question(page, "   ")
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    check_refusal_shown(page, text="The message is empty.")
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-refused .ragchat-note").text == \
        "Not sent: The message is empty."
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-refused .ragchat-retry")  # it must change first
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-input").get_attribute("value") == "   "
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-refused .ragchat-body").text == "(only spaces)"  # not a void
    if served == "asgi":
        page.save_screenshot(str(SHOTS / "9-only-spaces-refused.png"))
    assert not Conversation.objects.exists()
    ask(page, QUESTION)  # Send works again
    assert "$699" in last_answer_text(page) and Message.objects.count() == 2


def test_a_long_refused_paste_is_echoed_shortened_and_its_error_shown_once(page, asgi, product_corpus):
    """A new user's helpdesk: a 20,000-character paste, refused ``too_long``, stood whole in a
    bubble taller than the window, and its error was shown twice (under it and on the status
    line). Now the bubble shows its first 300 characters, "…" and its length; the error is shown
    once, under it; the whole text stays in the box to be shortened."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    paste = "The printer on the third floor jams whenever someone prints double-sided. " * 270
    assert len(paste) == 19_980 > message_limit(page)
    js(page, "document.querySelector('.ragchat-input').value = arguments[0]", paste)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    check_refusal_shown(page, text="the limit is")
    bubble = page.find_element(By.CSS_SELECTOR, ".ragchat-refused .ragchat-body")
    echo = bubble.get_attribute("textContent")
    assert echo.startswith(paste[:200]) and echo.endswith("… (19,980 characters)"), echo
    assert len(echo) < 330 and bubble.size["height"] < 150, (len(echo), bubble.size)
    assert page.find_element(By.CSS_SELECTOR, ".ragchat-input").get_attribute("value") == paste
    note = page.find_element(By.CSS_SELECTOR, ".ragchat-refused .ragchat-note").text
    assert note == "Not sent: The message has 19,980 characters; the limit is 16,000."
    assert seen_text(page).count("the limit is") == 1  # shown once (and heard once, on the status line)
    page.save_screenshot(str(SHOTS / "5-long-paste-refused.png"))
    # A short refused question still stands whole (what the user typed, exactly).
    short = "What about  the fourth floor?"
    result = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/static/django_ragchat/widget.js').then(({refusedEcho}) => done(
          [refusedEcho(arguments[0]), refusedEcho('é'.repeat(300)), refusedEcho('a'.repeat(301)).length]));
    """, short)
    assert result == [None, None, 301]
    blanks = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/static/django_ragchat/widget.js').then(({blankEcho}) => done(
          [blankEcho(' \\n\\t '), blankEcho('\\u200b\\u200b'), blankEcho(' a '), blankEcho('\\u3164')]));
    """)
    assert blanks == ["(only spaces)", "(nothing visible)", None, "(nothing visible)"]
    assert not Conversation.objects.exists()


def test_a_refusal_over_server_sent_events_is_shown_and_creates_nothing(page, wsgi, product_corpus, user):
    page.get(f"{wsgi.url}/chat/")  # a page of the site, to be allowed to set its cookie
    page.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    open_chat(page, f"{wsgi.url}/chat/")
    limit = message_limit(page)
    js(page, "document.querySelector('.ragchat-input').value = arguments[0]", "y" * (limit + 1))
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    check_refusal_shown(page, text="the limit is")
    assert stream_requests(page) and not Conversation.objects.exists()


def test_a_failed_answer_can_be_retried(page, asgi, product_corpus, openai_server):
    open_chat(page, f"{asgi.url}/chat/")
    conversation = Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], profile="fake")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    openai_server.fail_next("server_error", times=1, path="/v1/chat/completions")
    openai_server.when("", "The Aurora X2 costs $699 [1].")
    ask(page, QUESTION)
    answer = last_answer(page)
    note = answer.find_element(By.CSS_SELECTOR, ".ragchat-note")
    assert "ragchat-note-error" in note.get_attribute("class") and note.text
    # Shown once, on the answer; the status line says it to a screen reader only.
    status = page.find_element(By.CSS_SELECTOR, ".ragchat-status")
    heard = status.find_element(By.CSS_SELECTOR, ".ragchat-visually-hidden").get_attribute("textContent")
    assert heard and heard in note.text and heard == status.get_attribute("textContent")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(SCREENSHOTS / "failed-answer.png"))
    answer.find_element(By.CSS_SELECTOR, ".ragchat-retry").click()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")) == 2)
    wait(page, idle)
    check_cited_answer(page)
    statuses = list(conversation.messages.filter(role="assistant").order_by("seq").values_list("status", flat=True))
    assert statuses == ["error", "complete"]
    # A new user's trial: the question then stood twice. The failed attempt leaves the page (the
    # conversation keeps it), now and when the conversation is opened again.
    for _ in range(2):
        visible = [m for m in page.find_elements(By.CSS_SELECTOR, ".ragchat-message") if m.is_displayed()]
        assert [m.get_attribute("class").split()[1] for m in visible] == ["ragchat-user", "ragchat-assistant"]
        assert visible[0].text == QUESTION and "$699" in visible[1].text
        page.save_screenshot(str(SCREENSHOTS / "retried-answer.png"))
        open_chat(page, f"{asgi.url}/chat/")
        wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-message")) == 4)


def test_a_second_tab_on_the_conversation_shows_the_answer_live(page, asgi, product_corpus):
    first_tab = page.current_window_handle
    open_chat(page, f"{asgi.url}/chat/")
    ask(page, QUESTION)
    page.switch_to.new_window("tab")  # same browser, same session: the conversation opens there too
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"
                               " && document.querySelectorAll('.ragchat-message').length === 2"))
    second_tab = page.current_window_handle
    page.switch_to.window(first_tab)
    ask(page, "How much does the 256 GB model cost?")
    page.switch_to.window(second_tab)
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-message")) == 4
         and "$799" in last_answer(d).text)
    bodies = [b.text for b in page.find_elements(By.CSS_SELECTOR, ".ragchat-body")]
    assert bodies[2] == "How much does the 256 GB model cost?"  # the question typed in the other tab
    assert last_answer(page).find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    page.close()
    page.switch_to.window(first_tab)


def test_stop_in_one_tab_stops_the_answer_another_tab_asked_for(page, asgi, product_corpus, openai_server):
    openai_server.token_delay = 0.05
    openai_server.when("", " ".join(f"word{i}" for i in range(200)))
    open_chat(page, f"{asgi.url}/chat/")
    conversation = Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], profile="fake")
    page.refresh()
    first_tab = page.current_window_handle
    page.switch_to.new_window("tab")
    page.get(f"{asgi.url}/chat/")
    for tab in (page.current_window_handle, first_tab):  # both tabs live on the conversation
        page.switch_to.window(tab)
        wait(page, lambda d: js(d, "const l = document.querySelector('.ragchat-log');"
                                   " return l !== null && l.dataset.live === 'websocket'"))
    second_tab = page.window_handles[-1]
    type_question(page, QUESTION)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()  # asked in the first tab
    page.switch_to.window(second_tab)
    wait(page, lambda d: "word3" in last_answer_text(d))
    page.find_element(By.CSS_SELECTOR, ".ragchat-stop").click()  # stopped from the second
    for tab in (second_tab, first_tab):
        page.switch_to.window(tab)
        wait(page, lambda d: "Stopped before the end." in last_answer(d).text)
        assert page.find_element(By.CSS_SELECTOR, ".ragchat-send").is_enabled()
    answer = Message.objects.get(conversation=conversation, role="assistant")
    assert answer.status == "incomplete" and answer.content.startswith("word0 word1 word2 word3")
    page.switch_to.window(second_tab)
    page.close()
    page.switch_to.window(first_tab)


def test_the_page_streams_a_cited_answer_over_server_sent_events_under_wsgi(page, wsgi, product_corpus, user):
    page.get(f"{wsgi.url}/chat/")  # a page of the site, to be allowed to set its cookie
    page.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    open_chat(page, f"{wsgi.url}/chat/")
    ask(page, QUESTION)
    check_cited_answer(page)
    assert stream_requests(page) == [f"{wsgi.url}/chat/stream/"]  # a new conversation's endpoint
    conversation = Conversation.objects.get()
    assert conversation.owner == user
    ask(page, "How much does the 256 GB model cost?")  # then the conversation's own
    assert stream_requests(page)[-1] == f"{wsgi.url}/chat/conversations/{conversation.pk}/stream/"
    assert Conversation.objects.count() == 1 and conversation.messages.count() == 4


XSS = 'Look: <img src=x onerror="window.__xss=1"> and <script>window.__xss=2</script> done [1] [x](javascript:window.__xss=4)'


def test_model_output_and_questions_are_shown_as_text_never_as_html(page, asgi, product_corpus, openai_server):
    openai_server.when("", XSS)
    open_chat(page, f"{asgi.url}/chat/")
    session_key = page.get_cookie("sessionid")["value"]
    Conversation.objects.create(session_key=session_key, profile="fake", title="<b>title</b>")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open"))
    question = "What is <img src=y onerror=window.__xss=3>?"
    ask(page, question)

    def check():
        log = page.find_element(By.CSS_SELECTOR, ".ragchat-log")
        bodies = [b.text for b in log.find_elements(By.CSS_SELECTOR, ".ragchat-body")]
        assert bodies[-2:] == [question, XSS]
        assert log.find_elements(By.CSS_SELECTOR, "img, script, b") == []
        assert not [a for a in log.find_elements(By.CSS_SELECTOR, "a") if "javascript" in (a.get_attribute("href") or "")]
        assert page.find_element(By.CSS_SELECTOR, ".ragchat-conversation-title").text == "<b>title</b>"
        assert js(page, "return window.__xss === undefined")

    check()
    assert Message.objects.get(role="assistant").content == XSS
    page.refresh()  # the saved history renders the same way
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-body")) >= 2)
    check()


HOSTILE_DOC = """The hostile widget installs in ten minutes. <img src=x onerror="window.__xss=5"> and
<script>window.__xss=6</script> are part of this page's text, not markup.
"""


def test_a_document_with_html_is_cited_and_shown_as_text(page, asgi, product_corpus, openai_server):
    from django_ragchat.ingestion.pipeline import ingest_text

    # Plain text keeps the markup as written (the Markdown and HTML loaders drop tags).
    ingest_text("manuals/hostile.txt", HOSTILE_DOC, content_type="text", title="<b>Hostile</b> Widget Manual")
    openai_server.when("hostile", "It installs in ten minutes [1].")
    open_chat(page, f"{asgi.url}/chat/")
    Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"], profile="fake")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open"))
    ask(page, "How long does the hostile widget take to install?")
    answer = last_answer(page)
    assert answer.find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    sources = answer.find_elements(By.CSS_SELECTOR, ".ragchat-sources > li")
    hostile = [s for s in sources if "<b>Hostile</b> Widget Manual" in s.text]
    assert hostile, [s.text for s in sources]
    snippet = hostile[0].find_element(By.CSS_SELECTOR, ".ragchat-source-snippet").text
    assert '<img src=x onerror="window.__xss=5"> and <script>window.__xss=6</script>' in snippet
    log = page.find_element(By.CSS_SELECTOR, ".ragchat-log")
    assert log.find_elements(By.CSS_SELECTOR, "img, script") == []
    assert js(page, "return window.__xss === undefined")
    cited = {c.get_attribute("data-source") for c in answer.find_elements(By.CSS_SELECTOR, "a.ragchat-cite")}
    assert hostile[0].get_attribute("value") in cited


def test_markdown_module_builds_elements_and_never_html(page, asgi):
    open_chat(page, f"{asgi.url}/chat/")
    result = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/static/django_ragchat/markdown.js').then(({renderMarkdown}) => {
          const box = document.createElement('div');
          box.append(renderMarkdown([
            '# Title', 'one **bold** and *it* and `<i>code</i>`', '',
            '1. first', '2. second', '   - nested', '', '> quoted <u>u</u>', '',
            '```html', '<script>window.__xss=7</script>', '```',
            '[ok](https://example.com/a) [bad](javascript:alert(1)) [data](data:text/html,x) see [2]',
          ].join('\\n'), {cite: (n) => { const s = document.createElement('sup'); s.textContent = n; return s; }}));
          done({
            tags: [...box.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),
            links: [...box.querySelectorAll('a')].map(a => a.getAttribute('href')),
            text: box.textContent,
            nested: box.querySelector('ol > li > ul > li') && box.querySelector('ol > li > ul > li').textContent,
          });
        });
    """)
    assert set(result["tags"]) <= {"h3", "p", "strong", "em", "code", "ol", "ul", "li", "blockquote", "pre", "a", "sup",
                                   "br"}
    assert result["links"] == ["https://example.com/a"]
    assert "<i>code</i>" in result["text"] and "<u>u</u>" in result["text"] and "<script>" in result["text"]
    assert "[bad](javascript:alert(1))" in result["text"] and "[data](data:text/html,x)" in result["text"]
    assert result["nested"] == "nested"
    assert js(page, "return window.__xss === undefined")


def test_the_widget_is_usable_at_phone_width(page, asgi, product_corpus):
    page.set_window_size(390, 800)
    open_chat(page, f"{asgi.url}/chat/")
    ask(page, QUESTION)
    assert js(page, "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    toggle = page.find_element(By.CSS_SELECTOR, ".ragchat-toggle")
    new = page.find_element(By.CSS_SELECTOR, ".ragchat-new")
    assert toggle.is_displayed() and not new.is_displayed()  # the list folds behind a button
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true" and new.is_displayed()
    page.find_element(By.CSS_SELECTOR, ".ragchat-conversation").click()  # picking one folds it again
    wait(page, lambda d: not new.is_displayed())
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant"))
    check_cited_answer(page)
    # Keyboard only: the toggle, then New conversation, then typing and Enter.
    toggle.send_keys(Keys.ENTER)
    assert new.is_displayed()
    new.send_keys(Keys.ENTER)
    wait(page, lambda d: js(d, "return document.activeElement.classList.contains('ragchat-input')"))
    assert not page.find_elements(By.CSS_SELECTOR, ".ragchat-message")


def test_the_template_tag_puts_the_widget_on_any_page(page, asgi, product_corpus):
    """The page has a Content Security Policy without 'unsafe-inline' scripts: the widget
    needs none (its config is JSON, its code a module from the site)."""
    open_chat(page, f"{asgi.url}/embed/")
    assert page.find_elements(By.CSS_SELECTOR, ".ragchat") and page.find_element(By.TAG_NAME, "h1").text
    ask(page, QUESTION)
    check_cited_answer(page)


def test_two_widgets_on_a_page_keep_apart(page, asgi, product_corpus):
    page.get(f"{asgi.url}/embed-two/")
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat[data-ready='true']")) == 2)
    first, second = page.find_elements(By.CSS_SELECTOR, ".ragchat")
    assert first.get_attribute("id") != second.get_attribute("id")
    assert second.find_element(By.CSS_SELECTOR, ".ragchat-toggle").is_displayed()  # compact
    box = second.find_element(By.CSS_SELECTOR, ".ragchat-input")
    box.send_keys(QUESTION, Keys.ENTER)
    wait(page, lambda d: "$699" in second.text and second.find_elements(By.CSS_SELECTOR, "a.ragchat-cite"))
    wait(page, lambda d: second.find_element(By.CSS_SELECTOR, ".ragchat-send").is_enabled())
    assert not first.find_elements(By.CSS_SELECTOR, ".ragchat-message")
    link = second.find_element(By.CSS_SELECTOR, "a.ragchat-cite")
    assert second.find_elements(By.ID, link.get_attribute("href").split("#", 1)[1])  # its own source


@pytest.mark.parametrize("served", ["asgi", "wsgi"])
def test_a_widget_with_a_profile_starts_and_lists_that_profiles_conversations(page, request, served,
                                                                             product_corpus):
    """A site with several profiles had no way to put one on a page: every widget started its
    conversations with the default profile. Over the websocket (ASGI) and server-sent events
    (WSGI) alike."""
    from django_ragchat.models import Conversation

    server = request.getfixturevalue(served)
    open_chat(page, f"{server.url}/chat/")
    ask(page, QUESTION)  # a conversation of the default profile
    def listed(count: int) -> None:  # the list loads after the widget is ready: waited for
        wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation")) == count)

    open_chat(page, f"{server.url}/embed-profile/")
    ask(page, QUESTION)
    assert "$699" in last_answer_text(page) and last_answer_text(page).isupper()  # the "shout" augmenter
    assert sorted(Conversation.objects.values_list("profile", flat=True)) == ["default", "shouting"]
    listed(1)  # its own, not the default profile's
    open_chat(page, f"{server.url}/embed-profile/")
    listed(1)
    open_chat(page, f"{server.url}/chat/")  # the default widget lists them all
    listed(2)


def shown(driver, selector: str) -> list[str]:
    """The text of the elements ``selector`` finds that are displayed."""
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector) if e.is_displayed()]


def test_each_conversation_says_its_profile_and_the_notice_follows_the_one_open(page, asgi, product_corpus):
    """A new user's helpdesk with several profiles: the list did not say which conversation was
    whose, and the notice "... until a language model is configured" followed the default
    profile, even with a conversation of a profile with a model open. A widget with a profile of
    its own (one profile in sight) marks nothing. Each says its profile's title ("fake" is
    "Written answers"; "default" has none: its name), not the settings' key."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    session = page.get_cookie("sessionid")["value"]
    Conversation.objects.create(session_key=session, profile="fake", title="Printer jams on the third floor")
    Conversation.objects.create(session_key=session, profile="default", title="Warranty of the Aurora X2")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: len(shown(d, ".ragchat-conversation-profile")) == 2)
    assert shown(page, ".ragchat-conversation-profile") == ["default", "Written answers"]  # newest first
    assert shown(page, ".ragchat-conversation-title") == ["Warranty of the Aurora X2", "Printer jams on the third floor"]
    notice = page.find_element(By.CSS_SELECTOR, ".ragchat-model-notice")
    wait(page, lambda d: shown(d, ".ragchat-open .ragchat-conversation-profile") == ["default"])
    assert notice.is_displayed() and "until a language model is configured" in notice.text
    entries = page.find_elements(By.CSS_SELECTOR, ".ragchat-conversation")
    entries[1].click()  # the model's conversation: no notice
    wait(page, lambda d: shown(d, ".ragchat-open .ragchat-conversation-profile") == ["Written answers"])
    assert not notice.is_displayed()
    page.save_screenshot(str(SHOTS / "6-profiles-listed-model-conversation.png"))
    entries[0].click()
    wait(page, lambda d: notice.is_displayed())
    entries[1].click()
    wait(page, lambda d: not notice.is_displayed())
    page.find_element(By.CSS_SELECTOR, ".ragchat-new").click()  # a new one starts with the default profile
    wait(page, lambda d: notice.is_displayed())
    ask(page, QUESTION)
    wait(page, lambda d: shown(d, ".ragchat-open .ragchat-conversation-profile") == ["default"])
    assert len(shown(page, ".ragchat-conversation-profile")) == 3 and notice.is_displayed()
    page.save_screenshot(str(SHOTS / "7-profiles-listed-new-conversation.png"))
    # One profile in sight (a widget with its own): nothing extra.
    Conversation.objects.create(session_key=session, profile="shouting", title="Loud question")
    open_chat(page, f"{asgi.url}/embed-profile/")
    wait(page, lambda d: shown(d, ".ragchat-conversation-title") == ["Loud question"])
    assert not shown(page, ".ragchat-conversation-profile")


def test_the_profile_is_not_named_under_conversations_that_are_all_of_one(page, asgi, product_corpus):
    """A new user's helpdesk: "default" under every conversation of the list, which named the
    one profile they were all of (the visitor may use several: the live servers define them).
    The profile is shown only when the conversations listed are of more than one, and then under
    each (a conversation of another profile, listed or started, shows them)."""
    show_at_1280x800(page)
    open_chat(page, f"{asgi.url}/chat/")
    session = page.get_cookie("sessionid")["value"]
    Conversation.objects.create(session_key=session, title="Printer jams on the third floor")
    Conversation.objects.create(session_key=session, title="VPN drops every hour")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: shown(d, ".ragchat-conversation-title") == ["VPN drops every hour",
                                                                     "Printer jams on the third floor"])
    assert len(js(page, "return Object.keys(JSON.parse(document.querySelector("
                        "'script[type=\"application/json\"]').textContent).profiles)")) > 1  # several usable
    assert not shown(page, ".ragchat-conversation-profile")
    page.save_screenshot(str(SHOTS / "10-one-profile-listed-no-tags.png"))
    page.find_element(By.CSS_SELECTOR, ".ragchat-new").click()
    ask(page, QUESTION)  # a new one, of the same profile: still nothing
    wait(page, lambda d: len(shown(d, ".ragchat-conversation-title")) == 3)
    assert not shown(page, ".ragchat-conversation-profile")
    Conversation.objects.create(session_key=session, profile="fake", title="Written answer")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: shown(d, ".ragchat-conversation-profile") == ["Written answers", "default", "default",
                                                                       "default"])


def test_retry_is_not_offered_for_a_profile_no_retry_can_fix(page, asgi):
    """A new user's helpdesk: a profile that cannot be built was refused with a Retry button
    that could only fail again."""
    open_chat(page, f"{asgi.url}/chat/")
    found = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/static/django_ragchat/widget.js').then(({retryable}) => done(
          ['profile_unavailable', 'unknown_profile', 'too_long', 'settings_invalid', 'rate_limited',
           'turn_in_progress'].map(retryable)));
    """)
    assert found == [False, False, False, False, True, True]  # settings_invalid: a setting every turn reads


def test_excerpts_are_cut_at_a_word_boundary_without_the_heading(page, asgi):
    open_chat(page, f"{asgi.url}/chat/")
    result = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/static/django_ragchat/widget.js').then(({excerpt, uniqueSources}) => done({
          long: excerpt('Aurora X2 > Pricing\\n' + 'The Aurora X2 costs $699 with storage. '.repeat(10), 'Aurora X2 > Pricing'),
          cut: excerpt('Guide > Setup\\nInstall it with pip and then run the migrations before starting', 'Guide > Setup', 40, 300),
          short: excerpt('Guide\\nShort text.', 'Guide'),
          markdown: excerpt('## Setup\\nRun it.', ''),
          unique: uniqueSources([{index: 2}, {index: 1}, {index: 2}]).map(s => s.index),
        }));
    """)
    assert result["long"].startswith("The Aurora X2 costs") and result["long"].endswith("…")
    assert "Pricing" not in result["long"] and len(result["long"]) <= 221
    assert result["long"][:-1].split()[-1] in "The Aurora X2 costs $699 with storage.".split()  # a whole word
    assert result["cut"] == "Install it with pip and then run the…"
    assert result["short"] == "Short text." and result["markdown"] == "Run it."
    assert result["unique"] == [1, 2]


def test_older_conversations_load_a_page_at_a_time(page, asgi):
    open_chat(page, f"{asgi.url}/chat/")
    session_key = page.get_cookie("sessionid")["value"]
    for i in range(25):
        Conversation.objects.create(session_key=session_key, title=f"Topic {i:02d}")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation")) == 20)
    page.find_element(By.CSS_SELECTOR, ".ragchat-more").click()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation")) == 25)
    titles = [b.text for b in page.find_elements(By.CSS_SELECTOR, ".ragchat-conversation-title")]
    assert sorted(titles) == [f"Topic {i:02d}" for i in range(25)] and not page.find_elements(By.CSS_SELECTOR, ".ragchat-more")


def test_a_retry_event_replaces_the_streamed_text_and_a_footer_follows_the_answer(page, asgi):
    """The widget's handling of a guardrail's ``retry`` (docs/protocol.md) and of text streamed
    after the model's last token, fed as protocol events to the mounted widget."""
    open_chat(page, f"{asgi.url}/chat/")
    states = js(page, """
        const w = document.querySelector('.ragchat').ragchat;
        const turn = w.startTurnView(false, 'How much?');
        const body = () => turn.answer.body.textContent;
        const progress = () => turn.answer.progress.hidden ? '' : turn.answer.progress.textContent;
        const states = {};
        const source = {index: 1, chunk_id: 1, document_id: 1, source: 'a.md', title: 'Aurora X2',
                        heading: 'Aurora X2 > Pricing', snippet: 'Aurora X2 > Pricing\\nIt costs $699.'};
        w.onEvent(turn, {type: 'ack', assistant_message_id: 9, user_seq: 1});
        w.onEvent(turn, {type: 'sources', sources: [source]});
        w.onEvent(turn, {type: 'delta', text: 'It is ', index: 0});
        w.onEvent(turn, {type: 'delta', text: 'cheap.', index: 1});
        w.renderBody(turn.answer);
        states.first = body();
        w.onEvent(turn, {type: 'retry', attempt: 1, guardrail: 'require_citation'});
        states.afterRetry = [body(), progress()];
        w.onEvent(turn, {type: 'delta', text: 'It costs $699 [1].', index: 0});
        w.onEvent(turn, {type: 'delta', text: '\\n\\n---\\n_Prices include tax._', index: 1});
        w.renderBody(turn.answer);
        states.streamed = body();
        states.note = turn.answer.note.hidden ? '' : turn.answer.note.textContent;
        states.footer = [...turn.answer.body.querySelectorAll('hr + p > em')].map(e => e.textContent);
        states.links = [...turn.answer.body.querySelectorAll('a.ragchat-cite')].map(a => a.textContent);
        w.onEvent(turn, {type: 'done', message: {id: 9, role: 'assistant', status: 'complete',
          content: 'It costs $699 [1].\\n\\n---\\n_Prices include tax._', sources: [source],
          citations: [{index: 1, chunk_id: 1, source: 'a.md', title: 'Aurora X2'}]}});
        states.done = [body(), turn.ended, w.ui.send.disabled];
        return states;
    """)
    assert states["first"] == "It is cheap."
    assert states["afterRetry"] == ["", "Revising the answer…"]
    assert states["streamed"] == "It costs $699 [1].Prices include tax."
    assert states["note"] == ""  # the restart at index 0 is not a lost piece
    assert states["footer"] == ["Prices include tax."] and states["links"] == ["1"]
    assert states["done"] == ["It costs $699 [1].Prices include tax.", True, False]


def test_a_replace_event_shows_the_final_text_before_done(page, asgi):
    """An answer changed after the model (docs/protocol.md, ``replace``): the widget shows the
    final text as soon as it arrives, and a turn ended early shows its one delta."""
    open_chat(page, f"{asgi.url}/chat/")
    states = js(page, """
        const w = document.querySelector('.ragchat').ragchat;
        const turn = w.startTurnView(false, 'How much?');
        const body = () => turn.answer.body.textContent;
        const states = {};
        w.onEvent(turn, {type: 'ack', assistant_message_id: 9, user_seq: 1});
        w.onEvent(turn, {type: 'delta', text: 'It costs ', index: 0});
        w.onEvent(turn, {type: 'delta', text: '$699.', index: 1});
        w.renderBody(turn.answer);
        states.streamed = body();
        w.onEvent(turn, {type: 'replace', text: 'It costs $699. [stamped]'});
        states.replaced = [body(), turn.answer.note.hidden];
        const ended = w.startTurnView(false, 'Is this cached?');
        w.onEvent(ended, {type: 'ack', assistant_message_id: 11, user_seq: 3});
        w.onEvent(ended, {type: 'delta', text: 'From the cache.', index: 0});
        w.renderBody(ended.answer);
        states.ended = ended.answer.body.textContent;
        return states;
    """)
    assert states["streamed"] == "It costs $699."
    assert states["replaced"] == ["It costs $699. [stamped]", True]
    assert states["ended"] == "From the cache."


def test_cited_sources_only_shows_the_cited_passages_once_the_answer_is_saved(page, asgi):
    """``CITED_SOURCES_ONLY`` (on for signed-out visitors by default): no passage while the
    answer is written, then only the cited ones; [n] still links to its passage."""
    open_chat(page, f"{asgi.url}/chat/")
    states = js(page, """
        const w = document.querySelector('.ragchat').ragchat;
        w.config.citedSourcesOnly = true;
        const turn = w.startTurnView(false, 'How much?');
        const shown = () => [...turn.answer.sourceList.children].filter(li => !li.hidden)
                                .map(li => li.querySelector('.ragchat-source-title').textContent);
        const listed = () => !turn.answer.sourceList.hidden;
        const sources = [1, 2, 3].map(i => ({index: i, chunk_id: i, document_id: i, source: `d${i}.md`,
                                              title: `Doc ${i}`, heading: '', snippet: `Text ${i}.`}));
        const states = {};
        w.onEvent(turn, {type: 'ack', assistant_message_id: 9, user_seq: 1});
        w.onEvent(turn, {type: 'sources', sources});
        w.onEvent(turn, {type: 'delta', text: 'It costs $699 [2].', index: 0});
        w.renderBody(turn.answer);
        states.streaming = [listed(), shown()];
        w.onEvent(turn, {type: 'done', message: {id: 9, role: 'assistant', status: 'complete',
          content: 'It costs $699 [2].', sources,
          citations: [{index: 2, chunk_id: 2, source: 'd2.md', title: 'Doc 2'}]}});
        states.done = [listed(), shown(), [...turn.answer.body.querySelectorAll('a.ragchat-cite')].map(a => a.hash)];
        const declined = w.startTurnView(false, 'Anything?');
        w.onEvent(declined, {type: 'ack', assistant_message_id: 11, user_seq: 3});
        w.onEvent(declined, {type: 'done', message: {id: 11, role: 'assistant', status: 'complete',
          content: 'The documents do not say.', sources, citations: []}});
        states.declined = !declined.answer.sourceList.hidden || !declined.answer.sourcesLabel.hidden;
        return states;
    """)
    assert states["streaming"] == [False, []]
    assert states["done"][:2] == [True, ["Doc 2"]] and states["done"][2] and states["done"][2][0].endswith("-source-2")
    assert states["declined"] is False


def test_a_dropped_websocket_comes_back(page, asgi, product_corpus):
    open_chat(page, f"{asgi.url}/chat/")
    ask(page, QUESTION)
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    js(page, "document.querySelector('.ragchat').ragchat.socket.ws.close()")  # as a network drop would
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === undefined"))
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    ask(page, "How much does the 256 GB model cost?")
    assert "$799" in last_answer_text(page) and stream_requests(page) == []


def test_stop_over_server_sent_events_keeps_the_partial_answer(page, wsgi, product_corpus, user, openai_server):
    openai_server.when("", " ".join(f"word{i}" for i in range(50)))
    openai_server.token_delay = 0.05  # after the release: time for the server to see the client gone
    openai_server.hold_streams(after_tokens=4)
    conversation = Conversation.objects.create(owner=user, profile="fake")
    page.get(f"{wsgi.url}/chat/")
    page.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    open_chat(page, f"{wsgi.url}/chat/")
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".ragchat-conversation.ragchat-open"))
    type_question(page, QUESTION)
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    wait(page, lambda d: "word3" in last_answer_text(d))
    page.find_element(By.CSS_SELECTOR, ".ragchat-stop").click()  # closes the request
    wait(page, lambda d: "Stopped before the end." in last_answer(d).text)
    wait(page, idle)
    openai_server.release_streams()
    answer = wait(page, lambda d: Message.objects.filter(conversation=conversation, role="assistant")
                  .exclude(status="streaming").first())
    assert answer.status == "incomplete" and answer.content.startswith("word0 word1 word2 word3")
    assert "word49" not in answer.content
    assert stream_requests(page) == [f"{wsgi.url}/chat/conversations/{conversation.pk}/stream/"]


def test_a_footer_after_the_last_token_and_a_reprompted_answer(page, asgi, product_corpus, openai_server):
    """End to end (tests/live_settings.py, profile ``fake_cited``): the footer augmenter streams
    text after the model's last token; the require_citation guardrail rejects an uncited answer
    and the ``retry`` event replaces it with the model's second attempt."""
    openai_server.token_delay = 0.03
    openai_server.script("The Aurora X2 costs $699 [1].", "It costs $799.", "The 256 GB model costs $799 [1].")
    open_chat(page, f"{asgi.url}/chat/")
    conversation = Conversation.objects.create(session_key=page.get_cookie("sessionid")["value"],
                                               profile="fake_cited")
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: js(d, "return document.querySelector('.ragchat-log').dataset.live === 'websocket'"))
    ask(page, QUESTION)
    body = last_answer(page).find_element(By.CSS_SELECTOR, ".ragchat-body")
    assert body.text.startswith("The Aurora X2 costs $699 [1].") and body.find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    assert body.find_element(By.CSS_SELECTOR, "hr + p > em").text == "Checked against the product sheets."
    first = Message.objects.filter(conversation=conversation, role="assistant").get()
    assert first.content == "The Aurora X2 costs $699 [1].\n\n---\n_Checked against the product sheets._"

    js(page, """
        window.__seen = {texts: new Set(), stages: new Set()};
        new MutationObserver(() => {
          const a = document.querySelectorAll('.ragchat-assistant');
          const last = a[a.length - 1];
          window.__seen.texts.add(last.querySelector('.ragchat-body').textContent);
          const p = last.querySelector('.ragchat-progress');
          if (!p.hidden) window.__seen.stages.add(p.textContent);
        }).observe(document.querySelector('.ragchat-log'), {subtree: true, childList: true, characterData: true,
                                                            attributes: true});
    """)
    openai_server.hold_streams(after_tokens=2)  # the first attempt pauses half-written
    type_question(page, "How much does the 256 GB model cost?")
    page.find_element(By.CSS_SELECTOR, ".ragchat-send").click()
    wait(page, lambda d: last_answer_text(d).startswith("It costs"))  # the first attempt, streaming
    openai_server.release_streams()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".ragchat-assistant")) == 2 and idle(d))
    seen = js(page, "return {texts: [...window.__seen.texts], stages: [...window.__seen.stages]}")
    assert "Revising the answer…" in seen["stages"], seen  # the retry event cleared it
    body = last_answer(page).find_element(By.CSS_SELECTOR, ".ragchat-body")
    assert body.text.startswith("The 256 GB model costs $799 [1].") and "It costs $799." not in body.text
    assert body.find_elements(By.CSS_SELECTOR, "a.ragchat-cite")
    assert not last_answer(page).find_element(By.CSS_SELECTOR, ".ragchat-note").is_displayed()  # nothing "lost"


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
