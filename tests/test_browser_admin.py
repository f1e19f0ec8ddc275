"""The admin in headless Chromium: staff sign in, open a conversation and expand an answer's
trace, which shows the rewritten query and the cited source. Saves screenshots under
var/screenshots/ (ignored by git; docs/images/admin-trace.png is a copy of admin-trace.png).

The site runs in a server process of its own (the ``asgi`` fixture, uvicorn): pytest-django's
in-process ``live_server`` shares the test's SQLite connection between its request threads."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from django_ragchat.ingestion.pipeline import ingest_text
from django_ragchat.models import Conversation, Document, Feedback, Message, MessageSource, TurnTrace
from django_ragchat.testing.openai_server import call, tool_calls
from django_ragchat.turn.pipeline import run_turn_sync
from tests.live_servers import chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parent.parent / "var" / "screenshots"


@pytest.fixture
def browser():
    with chromium(window="1280,1400") as driver:
        yield driver


def test_staff_expand_a_turns_trace_and_see_the_rewritten_query_and_cited_source(
        browser, asgi, product_corpus, user, django_user_model):
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "Tell me about the Aurora X2 phone")
    result = run_turn_sync(conversation, "How much does it cost?")
    rewritten = result.trace["queries"]["final"]
    assert rewritten != "How much does it cost?"
    cited = MessageSource.objects.get(message_id=result.message["id"], cited=True, rank=1)

    sign_in_as_boss(browser, asgi, django_user_model)
    # From the conversation list (owner and first question shown) to the conversation.
    browser.get(asgi.url + reverse("admin:django_ragchat_conversation_changelist"))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "admin-conversations.png"))
    row = browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr")
    assert "Tell me about the Aurora X2 phone" in row.text and "alice" in row.text
    row.find_element(By.CSS_SELECTOR, "th a").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "ragchat-transcript"))
    browser.save_screenshot(str(SCREENSHOTS / "admin-conversation.png"))

    turn = browser.find_element(By.ID, f"message-{result.message['id']}")
    trace = turn.find_element(By.CSS_SELECTOR, "details.ragchat-trace")
    assert trace.get_attribute("open") is None  # collapsed by default
    query = trace.find_element(By.CSS_SELECTOR, ".ragchat-rewritten")
    assert not query.is_displayed()
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", turn)
    trace.find_element(By.TAG_NAME, "summary").click()
    WebDriverWait(browser, 10).until(lambda d: query.is_displayed())
    assert query.text == rewritten
    documents = trace.find_element(By.CSS_SELECTOR, ".ragchat-trace-documents")
    first = documents.find_element(By.CSS_SELECTOR, "li")
    assert cited.title in first.text and "cited" in first.find_element(By.CSS_SELECTOR, ".ragchat-badge").text
    assert "Pricing" in first.text  # the heading of the cited chunk
    assert trace.find_elements(By.CSS_SELECTOR, ".ragchat-hits tr.ragchat-cited")

    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", turn)
    assert turn.screenshot(str(SCREENSHOTS / "admin-trace.png"))

    # What the post-processors did to the passages (top_k cut the list) and the augmenters to the answer.
    postprocess = trace.find_element(By.CSS_SELECTOR, ".ragchat-trace-postprocess")
    top_k = postprocess.find_element(By.XPATH, ".//tr[td/code[text()='top_k']]")
    cut = [d for d in result.trace["postprocess"] if d["by"] == "top_k"][0]
    assert f"{cut['in']} → {cut['out']}" in top_k.text and "Dropped:" in top_k.text
    augmenters = trace.find_element(By.CSS_SELECTOR, ".ragchat-trace-augmenters")
    assert "citations changed" in augmenters.find_element(By.XPATH, ".//tr[td/code[text()='citations']]").text
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", postprocess)
    assert postprocess.screenshot(str(SCREENSHOTS / "admin-trace-postprocess.png"))
    assert augmenters.screenshot(str(SCREENSHOTS / "admin-trace-augmenters.png"))


def test_staff_erase_a_users_chat_data_after_a_page_counting_it(browser, asgi, product_corpus, user,
                                                                django_user_model):
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    # What erasing leaves: a document given to her by name (what a model source indexes from a
    # row of hers) stays, and the page counts it.
    ingest_text("upload/alice-contract.md", "# Contract\n\nSigned.", access=[f"user:{user.pk}"])
    sign_in_as_boss(browser, asgi, django_user_model)
    browser.get(asgi.url + reverse("admin:django_ragchat_conversation_change", args=[conversation.pk]))
    browser.find_element(By.LINK_TEXT, "Export or erase this user's chat data").click()
    counts = WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "ragchat-user-data-counts"))
    rows = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td")[1].text
            for r in counts.find_elements(By.CSS_SELECTOR, "tbody tr")}
    assert rows["Conversations"] == "1" and rows["Messages"] == "2" and rows["Traces"] == "1"
    kept = browser.find_element(By.ID, "ragchat-user-data-documents").text
    assert "Files and uploads 1" in kept, kept
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "admin-user-data.png"))
    browser.find_element(By.CSS_SELECTOR, "#ragchat-erase [type=submit]").click()
    WebDriverWait(browser, 20).until(lambda d: "Erased the chat data of alice" in d.page_source)
    assert not Conversation.objects.filter(owner=user).exists()
    assert Document.objects.filter(source="upload/alice-contract.md").exists()


def sign_in_as_boss(browser, asgi, django_user_model) -> None:
    django_user_model.objects.create_superuser("boss", "boss@example.com", "secret-pw")
    browser.get(asgi.url + reverse("admin:login"))
    browser.find_element(By.ID, "id_username").send_keys("boss")
    browser.find_element(By.ID, "id_password").send_keys("secret-pw")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "user-tools"))


def test_a_trace_page_has_one_raw_json_and_the_trace_list_names_how_each_turn_ended(
        browser, asgi, product_corpus, user, django_user_model):
    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    answer = Message.objects.get(pk=result.message["id"])
    # An answer longer than its link, with markup the model wrote: cut at a word, shown as text.
    Message.objects.filter(pk=answer.pk).update(
        content="The <b>Aurora X2</b> costs $699 with 256 GB of storage, a wonderfully bright display")
    Feedback.objects.create(message=answer, user=user, rating="up")
    canned = Message.objects.create(conversation=conversation, seq=4, role="assistant", content="From the cache.")
    TurnTrace.objects.create(message=canned, profile="default", ended_by="advisors")
    sign_in_as_boss(browser, asgi, django_user_model)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    browser.get(asgi.url + reverse("admin:django_ragchat_turntrace_change", args=[answer.trace.pk]))
    body = browser.find_element(By.TAG_NAME, "body")
    assert body.text.count("Raw JSON") == 1
    raw = browser.find_element(By.LINK_TEXT, "Raw JSON")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", raw)
    browser.save_screenshot(str(SCREENSHOTS / "admin-trace-raw-json.png"))

    browser.get(asgi.url + reverse("admin:django_ragchat_turntrace_changelist"))
    ended = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "td.field-ended_early_by")]
    assert sorted(ended) == ["advisors", "none (ran to the end)"]
    choices = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#changelist-filter a")]
    assert "none (ran to the end)" in choices and "input_guardrails" in choices
    answer_link = browser.find_element(By.CSS_SELECTOR, f".field-message_link a[href$='/message/{answer.pk}/change/']")
    # The answer's words: "Trace of assistant #2" beside it names the row already.
    assert answer_link.text == "The <b>Aurora X2</b> costs $699 with 256 GB of storage, a…"
    browser.save_screenshot(str(SCREENSHOTS / "admin-traces-ended-by.png"))
    browser.find_element(By.LINK_TEXT, "none (ran to the end)").click()
    WebDriverWait(browser, 20).until(lambda d: "ended_by=none" in d.current_url)
    assert [td.text for td in browser.find_elements(By.CSS_SELECTOR, "td.field-ended_early_by")] == [
        "none (ran to the end)"]

    browser.get(asgi.url + reverse("admin:django_ragchat_feedback_changelist"))
    link = browser.find_element(By.CSS_SELECTOR, ".field-message_link a")
    assert link.text.endswith("storage, a…")
    browser.save_screenshot(str(SCREENSHOTS / "admin-feedback-answer-link.png"))


# A question, a comment and a memory as long as people write them; a document named by its URL.
LONG_QUESTION = ("How much does the Aurora X2 cost with 256 GB of storage, and is the price the same in every "
                 "country where it is sold?")
PASTED_LINK = "https://shop.example.com/account/orders/ORD-2026-000017/invoice?format=pdf&download=1"
LONG_SOURCE = "https://support.example.com/knowledge-base/products/phones/aurora-x2/pricing-and-storage-options.md"


WIDTHS = """const box = document.querySelector('#changelist .results');
return {page: document.documentElement.scrollWidth, window: window.innerWidth,
        list: box.scrollWidth, box: box.clientWidth};"""


def fill_every_list(user) -> None:
    """A row, or a few, in each of the app's admin lists, with text of a realistic length."""
    import datetime

    from django.utils import timezone

    from django_ragchat.ingestion.pipeline import ingest_text
    from django_ragchat.models import ApiKey, MemoryRecord, SourceState, ToolInvocation

    ingest_text(LONG_SOURCE, "# Aurora X2 pricing and storage options by country\n\n## Prices\n"
                "The Aurora X2 costs $699 with 256 GB of storage in every country where it is sold.",
                title="Aurora X2 — pricing, storage options and availability by country", content_type="markdown")
    conversation = Conversation.objects.create(owner=user, title=LONG_QUESTION[:80])
    result = run_turn_sync(conversation, LONG_QUESTION)
    answer = Message.objects.get(pk=result.message["id"])
    Conversation.objects.create(session_key="k" * 32)  # an anonymous visitor's, empty
    # A pasted link as the question: one long word in every column that names the conversation.
    pasted = Conversation.objects.create(owner=user, title=PASTED_LINK[:80])
    run_turn_sync(pasted, PASTED_LINK)
    Feedback.objects.create(message=answer, user=user, rating="down", comment=(
        "The answer gives the price in dollars only; I asked about every country, and the storage options "
        "differ in Europe."))
    MemoryRecord.objects.create(user=user, conversation=conversation, kind="summary", covers_until_seq=2, content=(
        "The user asked about the price of the Aurora X2 with 256 GB of storage in several countries and "
        "was told it costs $699."))
    # Tool calls as a model makes them: long snake_case names, JSON arguments, a duration to the
    # microsecond (a float), one waiting for the user's approval.
    ToolInvocation.objects.create(message=answer, call_id="call_8f2d1c7e9a4b4d0f9c3e2a1b", name="lookup_order",
                                  arguments='{"order": "ORD-17"}', status="done", content='{"status": "shipped"}',
                                  ms=4.102614000203175)
    ToolInvocation.objects.create(
        message=answer, call_id="call_3b9e0a6f1d2c4e8a9b7c5d3e", step=2, name="check_warranty_and_repair_options",
        label="Checking the warranty of the Aurora X2…",
        arguments='{"product": "Aurora X2", "country": "DE", "purchased_on": "2026-03-14"}', status="done",
        content='{"warranty": "24 months", "repair": "mail-in"}', ms=1234.5678901234567)
    ToolInvocation.objects.create(
        message=answer, call_id="call_c1d2e3f4a5b6c7d8e9f0a1b2", step=2, index=1,
        name="cancel_order_and_refund_payment", arguments='{"order": "ORD-2026-000017", "reason": "changed my mind"}',
        status="pending", requires_confirmation=True, ms=0.0)
    key = ApiKey(user=user, name="Reporting dashboard (production)")
    key.set_key(ApiKey.generate())
    key.save()
    SourceState.objects.create(
        name="shop.Product", last_sync={"mode": "since", "counts": {"created": 12, "updated": 3, "unchanged": 240}},
        last_sync_finished_at=timezone.now() - datetime.timedelta(hours=2), last_live_sync_at=timezone.now(),
        last_error="OperationalError: could not connect to server: Connection refused. Is the server running on "
                   "host db.internal and accepting TCP/IP connections on port 5432?")


def test_every_changelist_fits_a_1280_px_wide_window(asgi, product_corpus, user, django_user_model):
    """No list of the app scrolls sideways at 1280x800 (the admin's sidebar open, as it is at
    first) with text of a realistic length in it: neither the page nor the table in its box."""
    from django.contrib import admin

    fill_every_list(user)
    with chromium(window="1280,800") as browser:
        sign_in_as_boss(browser, asgi, django_user_model)
        assert browser.execute_script("return window.innerWidth") == 1280
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        wide = {}
        for model in sorted((m for m in admin.site._registry if m._meta.app_label == "django_ragchat"),
                            key=lambda m: m._meta.model_name):
            name = model._meta.model_name
            browser.get(asgi.url + reverse(f"admin:django_ragchat_{name}_changelist"))
            assert browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"), name  # rows to measure
            browser.save_screenshot(str(SCREENSHOTS / f"admin-list-{name}.png"))
            # The page, and the list's own box: the admin scrolls a wide table inside it (.results).
            widths = browser.execute_script(WIDTHS)
            if widths["page"] > widths["window"] or widths["list"] > widths["box"]:
                wide[name] = widths
        assert not wide, f"wider than the window (1280 px) or than the list's box: {wide}"


def test_staff_correct_a_summary_and_read_what_wrote_it(browser, asgi, user, django_user_model):
    from django_ragchat.models import MemoryRecord

    conversation = Conversation.objects.create(owner=user, title="Warranty questions")
    record = MemoryRecord.objects.create(conversation=conversation, kind="summary", covers_until_seq=6,
                                         content="The user asked about the Aurora X2's warranty.",
                                         metadata={"model": "gpt-4o-mini", "folded_messages": 6,
                                                   "updated_by": "summary memory"})
    sign_in_as_boss(browser, asgi, django_user_model)
    browser.get(asgi.url + reverse("admin:django_ragchat_memoryrecord_change", args=[record.pk]))
    details = WebDriverWait(browser, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "dl.ragchat-details"))
    assert details.text.split("\n") == ["folded messages", "6", "model", "gpt-4o-mini", "updated by",
                                        "summary memory"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "admin-memory-record.png"))
    content = browser.find_element(By.ID, "id_content")
    content.clear()
    content.send_keys("The user asked about the Aurora X2's two-year warranty.")
    browser.find_element(By.CSS_SELECTOR, "input[name=_save]").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    record.refresh_from_db()
    assert "two-year" in record.content and record.metadata["folded_messages"] == 6


# How an element's text (lines of indented JSON) wraps: ``inside``, each place a line is broken
# inside a word, with the characters either side (a line may break after a space or a hyphen, as
# prose does; "purcha|sed_on" is inside); ``under``, the first characters of each continuation
# that starts left of its line's own text, under the key of a long value or the opening brace.
# A line ends at a newline the text holds or at the end of a block of its own.
WRAPS = """const inside = [], under = [];
const lineOf = node => node.parentElement.closest('.ragchat-lines > *') || arguments[0];
const walker = document.createTreeWalker(arguments[0], NodeFilter.SHOW_TEXT);
let top = null, start = null, previous = '\\n', line = null;
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (lineOf(node) !== line) {
    line = lineOf(node);
    previous = '\\n';
  }
  for (let i = 0; i < node.data.length; i++) {
    const range = document.createRange();
    range.setStart(node, i);
    range.setEnd(node, i + 1);
    const rect = range.getClientRects()[0];
    const character = node.data[i];
    if (previous === '\\n') [top, start] = [null, null];
    if (rect && character !== '\\n') {
      if (top !== null && rect.top > top + 2) {
        if (!/[\\s-]/.test(previous)) inside.push(previous + '|' + character);
        if (rect.left <= start + 1) under.push(node.data.slice(i, i + 12));
      }
      if (start === null && character !== ' ') start = rect.left;
      top = rect.top;
    }
    previous = character;
  }
}
return {inside, under};"""


def test_a_traces_tool_arguments_are_readable_json(browser, asgi, product_corpus, user, django_user_model,
                                                   openai_server, ragchat_settings_override):
    """A new user's trial: the Tool calls table's arguments column, narrow beside a long result
    (the passages a search returned), broke the JSON anywhere (``overflow-wrap: anywhere``). Each
    call's arguments are indented JSON, one key a line, a long line broken only between words and
    continued beside its key, not under it, and the page does not scroll sideways. Screenshot: var/screenshots/admin-trace-tool-arguments.png."""
    ragchat_settings_override(PLUGINS=["tests.tool_plugins"], PROFILES={"default": {
        "llm": "openai", "tools": ["weather", "refuse"], "retrieval": "tool", "empty_context": "answer",
        "options": {"openai": {"base_url": openai_server.base_url, "max_retries": 0, "timeout": 10}}}})
    reason = ("the customer asked for a refund of order ORD-2026-000017 to another card than the one she "
              "paid with, which the shop's policy does not allow")
    openai_server.script(tool_calls(call("search_documents", query="Aurora X2 price with 256 GB of storage", id="s"),
                                    call("weather", city="Saint-Rémy-de-Provence", unit="C", id="w"),
                                    call("refuse", reason=reason, id="r")),
                         "The Aurora X2 costs $799 with 256 GB [1]; it is sunny in Saint-Rémy-de-Provence.")
    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "How much is the Aurora X2 with 256 GB, and is it sunny in Saint-Rémy?")
    assert [t["name"] for t in result.trace["tools"]] == ["search_documents", "weather", "refuse"]
    answer = Message.objects.get(pk=result.message["id"])
    sign_in_as_boss(browser, asgi, django_user_model)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pages = {"trace": reverse("admin:django_ragchat_turntrace_change", args=[answer.trace.pk]),
             "conversation": reverse("admin:django_ragchat_conversation_change", args=[conversation.pk])}
    for name, page in pages.items():
        browser.get(asgi.url + page)
        table = WebDriverWait(browser, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "table.ragchat-tools"))
        if name == "conversation":
            browser.execute_script("arguments[0].closest('details').open = true", table)
        browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", table)
        assert table.screenshot(str(SCREENSHOTS / f"admin-{name}-tool-arguments.png"))
        shown = table.find_elements(By.CSS_SELECTOR, "pre.ragchat-tool-arguments")
        assert [pre.text for pre in shown] == [
            '{\n  "query": "Aurora X2 price with 256 GB of storage"\n}',
            '{\n  "city": "Saint-Rémy-de-Provence",\n  "unit": "C"\n}', '{\n  "reason": "' + reason + '"\n}']
        for pre in shown:
            assert browser.execute_script(WRAPS, pre) == {"inside": [], "under": []}, (name, pre.text)
        assert any(pre.size["height"] > 100 for pre in shown)  # the reason wraps: the measure has lines
        # At 1280 px the table fits its box (narrower, it would scroll in it); the page never scrolls sideways.
        widths = browser.execute_script("const box = arguments[0].parentElement; return [box.scrollWidth, "
                                        "box.clientWidth, document.documentElement.scrollWidth, window.innerWidth]",
                                        table)
        assert widths[0] <= widths[1] and widths[2] <= widths[3], (name, widths)
