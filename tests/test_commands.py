"""The management commands: ragchat_ingest, ragchat_chat, ragchat_plugins and ragchat_purge.

This module is also a plugin (listed in ``RAGCHAT["PLUGINS"]`` by the tests that need it): it
registers a slow answerer, so that a test can press Ctrl-C while an answer is being written.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_ragchat import hookimpl, plugins
from django_ragchat.models import Conversation, Document, MemoryRecord, Message, MessageSource, TurnTrace
from django_ragchat.stages.llms import LLMBackend
from django_ragchat.types import LLMDelta

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DOCS = "example_project/sample_docs"


class SlowAnswerer(LLMBackend):
    """Streams "word0 word1 ..." slowly; ``started`` is set once the first word is out. After
    its first few words it slows to half a second a word, so a Ctrl-C pressed on a loaded
    machine (a CI run of 4 suites on 2 cores once saw all 200 words out at 20 ms each before
    the signal landed) still finds it streaming."""

    name = "slow"
    model = "slow"
    started = threading.Event()

    async def stream(self, prompt, turn):
        for n in range(200):
            yield LLMDelta(text=f"word{n} ")
            type(self).started.set()
            await asyncio.sleep(0.02 if n < 5 else 0.5)


@hookimpl
def register_llm_backends(register):
    register(SlowAnswerer)


def run(*args, **kwargs) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **kwargs)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def sample_docs(monkeypatch):
    """The demo's product documents, ingested through the command from the repository root."""
    monkeypatch.chdir(REPO)
    out, _ = run("ragchat_ingest", SAMPLE_DOCS, "--no-progress")
    assert "0 failed" in out
    return out


# --- ragchat_ingest -------------------------------------------------------------------------


def test_ingest_reports_failures_and_closes_with_counts(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\nAlpha text.")
    (tmp_path / "b.rst").write_text("B\n=\n\nBeta text.")
    (tmp_path / "bad.txt").write_bytes(b"GIF89a\x00\x01")

    out, err = run("ragchat_ingest", str(tmp_path), "--root", str(tmp_path), "--metadata", '{"team": "docs"}')

    assert err.strip() == f"{tmp_path / 'bad.txt'}: binary file"
    closing = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"Ingested 3 document\(s\): 2 created, 0 updated, 0 unchanged, 1 failed; 2 chunk\(s\) written in space "
        r"wordllama-l2-supercat-256 in \d+\.\d\ds \(load \d+\.\d\ds, embed \d+\.\d\ds in 1 call\(s\), store \d+\.\d\ds\)",
        closing,
    ), closing
    assert dict(Document.objects.values_list("source", "metadata")) == {"a.md": {"team": "docs"},
                                                                        "b.rst": {"team": "docs"}}

    out, _ = run("ragchat_ingest", str(tmp_path), "--root", str(tmp_path), "--metadata", '{"team": "docs"}')
    assert "0 created, 0 updated, 2 unchanged, 1 failed; 0 chunk(s) written" in out


def test_ingest_names_files_stored_again_from_another_working_folder(tmp_path, monkeypatch):
    docs = tmp_path / "site" / "docs"
    docs.mkdir(parents=True)
    for name in ("contact.md", "shipping.md"):
        (docs / name).write_text(f"# {name}\n\nText of {name}.")
    monkeypatch.chdir(tmp_path / "site")
    _, err = run("ragchat_ingest", "docs", "--no-progress")
    assert err == ""
    monkeypatch.chdir(docs)  # the same files, stored relative to another folder
    out, err = run("ragchat_ingest", ".", "--no-progress")
    assert "2 created" in out.splitlines()[-1]
    assert err.strip() == (
        "2 new document(s) repeat a file stored under another path (contact.md = docs/contact.md; "
        "shipping.md = docs/shipping.md). Sources are relative to the working folder: ingest from the same "
        "folder each time, or pass --root; delete the copies in the admin (Documents).")


def test_ingest_fails_only_when_nothing_was_found_or_everything_failed(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandError, match=r"No documents found in .*empty \(supported: .*\.md"):
        run("ragchat_ingest", str(tmp_path / "empty"))
    (tmp_path / "bad.md").write_bytes(b"\x00")
    err = io.StringIO()
    with pytest.raises(CommandError, match="Every document failed"):
        call_command("ragchat_ingest", str(tmp_path / "bad.md"), str(tmp_path / "gone.md"),
                     stdout=io.StringIO(), stderr=err)
    assert err.getvalue().splitlines() == [f"{tmp_path / 'bad.md'}: binary file",
                                           f"{tmp_path / 'gone.md'}: not found (no such file or folder)"]
    assert not Document.objects.exists()


def test_ingest_of_a_folder_that_is_not_there_says_not_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a new site, without the docs/ folder README's reader may type
    err = io.StringIO()
    with pytest.raises(CommandError, match="Every document failed"):
        call_command("ragchat_ingest", "docs/", stdout=io.StringIO(), stderr=err)
    assert err.getvalue().splitlines() == ["docs: not found (no such file or folder)"]


@pytest.mark.parametrize("args, message", [
    (["--metadata", "{nope"], "--metadata is not valid JSON"),
    (["--metadata", "[1, 2]"], "--metadata must be a JSON object"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--profile", "nosuch"], "No profile named 'nosuch'"),
    (["--root", "/nonexistent-root"], "is not a folder"),
])
def test_ingest_rejects_bad_options_clearly(tmp_path, args, message):
    (tmp_path / "a.md").write_text("# A\n\ntext")
    with pytest.raises(CommandError, match=re.escape(message)):
        run("ragchat_ingest", str(tmp_path), *args)
    assert not Document.objects.exists()


# --- ragchat_chat ---------------------------------------------------------------------------


def chat_json(*args) -> dict:
    out, _ = run("ragchat_chat", "--json", *args)
    return json.loads(out)  # exactly one JSON object, nothing else on stdout


def test_chat_json_answers_with_citations_sources_and_trace(sample_docs):
    data = chat_json("--message", "How much does the Aurora X2 cost?")

    assert set(data) == {"conversation_id", "answer", "status", "citations", "sources", "trace", "error"}
    assert data["status"] == "complete" and data["error"] is None
    assert "$699" in data["answer"] and re.search(r"\[\d\]", data["answer"])
    assert [s["index"] for s in data["sources"]] == list(range(1, len(data["sources"]) + 1))
    assert data["sources"][0]["source"] == f"{SAMPLE_DOCS}/aurora-x2.md"
    assert data["sources"][0]["heading"] == "Aurora X2 > Pricing"
    assert data["citations"] and data["citations"][0]["source"] == f"{SAMPLE_DOCS}/aurora-x2.md"
    trace = data["trace"]
    assert trace["queries"]["original"] == "How much does the Aurora X2 cost?"
    assert trace["documents"][0]["source"] == f"{SAMPLE_DOCS}/aurora-x2.md" and trace["timings"]["total"] > 0
    conversation = Conversation.objects.get(pk=data["conversation_id"])
    assert conversation.owner is None and conversation.profile == "default"
    assert conversation.title == "How much does the Aurora X2 cost?"


def test_chat_continues_a_conversation_and_resolves_the_follow_up(sample_docs):
    first = chat_json("--message", "Tell me about the Aurora X2 phone")
    follow_up = chat_json("--conversation", first["conversation_id"], "--message", "How much does it cost?")

    assert follow_up["conversation_id"] == first["conversation_id"]
    seqs = list(Message.objects.filter(conversation_id=first["conversation_id"]).values_list("seq", "role"))
    assert seqs == [(1, "user"), (2, "assistant"), (3, "user"), (4, "assistant")]
    # The follow-up names no product; the history makes it about the Aurora X2's price.
    assert "Aurora" in follow_up["trace"]["queries"]["final"]
    assert follow_up["sources"][0]["heading"] == "Aurora X2 > Pricing"
    assert "$699" in follow_up["answer"]


def test_without_the_follow_up_transformer_the_sample_docs_answer_the_wrong_product(sample_docs, ragchat_settings_override):
    # The counter-test on the demo corpus: a plain retriever cannot know which product "it" is.
    ragchat_settings_override(PROFILES={"default": {}, "plain": {"query_transformers": []}})
    first = chat_json("--profile", "plain", "--message", "Tell me about the Aurora X2 phone")
    follow_up = chat_json("--conversation", first["conversation_id"], "--message", "How much does it cost?")
    assert follow_up["sources"][0]["heading"] != "Aurora X2 > Pricing"
    assert "$699" not in follow_up["answer"]


def test_chat_streams_the_answer_then_numbered_sources(sample_docs):
    out, err = run("ragchat_chat", "--message", "What warranty do Zephyr Buds have?")
    answer, _, sources = out.partition("Sources:\n")
    assert "two-year warranty" in answer and "[1]" in answer
    assert sources.splitlines()[0] == f"  [1] {SAMPLE_DOCS}/zephyr-buds.md — Zephyr Buds > Warranty (cited)"
    conversation = Conversation.objects.get()
    assert err.strip() == f"conversation: {conversation.pk}"


@pytest.mark.parametrize("message, error", [
    ("", "The message is empty."),
    ("   \n ", "The message is empty."),
    ("x" * 16_001, "The message has 16,001 characters; the limit is 16,000."),
    ("nul\x00byte", "The message contains NUL characters."),
])
def test_chat_refuses_invalid_messages_and_creates_nothing(message, error):
    with pytest.raises(CommandError, match=re.escape(error)):
        run("ragchat_chat", "--message", message)
    with pytest.raises(CommandError, match=re.escape(error)):
        run("ragchat_chat", "--json", "--message", message)
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_chat_rejects_bad_options(sample_docs, user):
    with pytest.raises(CommandError, match="--json prints one answer"):
        run("ragchat_chat", "--json")
    with pytest.raises(CommandError, match="is not a conversation id"):
        run("ragchat_chat", "--conversation", "nope", "--message", "hi")
    with pytest.raises(CommandError, match="No conversation 00000000-0000-0000-0000-000000000000"):
        run("ragchat_chat", "--conversation", "00000000-0000-0000-0000-000000000000", "--message", "hi")
    with pytest.raises(CommandError, match="No user 'nobody'"):
        run("ragchat_chat", "--user", "nobody", "--message", "hi")
    with pytest.raises(CommandError, match="No profile named 'nosuch'"):
        run("ragchat_chat", "--profile", "nosuch", "--message", "hi")
    theirs = Conversation.objects.create(owner=user)
    with pytest.raises(CommandError, match="uses profile 'default', not 'other'"):
        with_profiles = {"default": {}, "other": {}}
        from django.test import override_settings

        with override_settings(RAGCHAT={"LOAD_ENTRY_POINTS": False, "PROFILES": with_profiles}):
            run("ragchat_chat", "--conversation", str(theirs.pk), "--profile", "other", "--message", "hi")
    assert not Message.objects.exists()


def test_chat_as_a_user_owns_new_conversations_and_opens_only_accessible_ones(sample_docs, user, other_user):
    data = chat_json("--user", "alice", "--message", "What does the Nimbus Tab cost?")
    conversation = Conversation.objects.get(pk=data["conversation_id"])
    assert conversation.owner == user
    with pytest.raises(CommandError, match="that user bob may open"):
        run("ragchat_chat", "--user", "bob", "--conversation", str(conversation.pk), "--message", "And the pen?")
    assert conversation.messages.count() == 2


def test_interactive_chat_reads_until_quit(sample_docs):
    stdin = io.StringIO("What does the Nimbus Tab cost?\n\n   \nHow long does its battery last?\n/quit\nnever read\n")
    out, err = run("ragchat_chat", stdin=stdin)

    assert out.startswith("Chatting in a new conversation with profile 'default'.")
    assert out.count("you> ") == 5  # two questions, two blank lines, /quit
    assert "$449" in out and "twelve hours" in out  # "its" is resolved to the Nimbus Tab
    assert out.count("Sources:") == 2
    conversation = Conversation.objects.get()
    assert out.rstrip().endswith(f"conversation: {conversation.pk}")
    assert list(conversation.messages.values_list("content", flat=True)[::2]) == [
        "What does the Nimbus Tab cost?", "How long does its battery last?"]
    assert err == ""


def test_interactive_chat_reports_bad_input_and_goes_on():
    out, err = run("ragchat_chat", stdin=io.StringIO("x" * 16_001 + "\n"))  # then end of input
    assert "limit is 16,000" in err
    assert not Conversation.objects.exists()
    assert "conversation:" not in out


def test_ctrl_c_stops_the_answer_and_saves_it_as_incomplete(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.test_commands"],
                              PROFILES={"default": {"llm": "slow", "empty_context": "answer"}})
    SlowAnswerer.started.clear()

    def press_ctrl_c():
        if SlowAnswerer.started.wait(10):
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handling, whatever disposition the runner inherited (under nohup or
    # a shell's `&`, SIGINT starts out ignored and Python keeps it so).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    try:
        out, _ = run("ragchat_chat", stdin=io.StringIO("Tell me everything\n/quit\n"))
        restored = signal.getsignal(signal.SIGINT)
    finally:
        presser.join()
        signal.signal(signal.SIGINT, inherited)

    assert "word0" in out and "word199" not in out
    assert "[stopped: the partial answer was saved as incomplete]" in out
    assert out.count("you> ") == 2  # the loop went on after the interruption
    assistant = Message.objects.get(role="assistant")
    assert assistant.status == "incomplete"
    assert assistant.content.startswith("word0 ") and len(assistant.content.split()) < 200
    assert assistant.metadata["error"]["code"] == "cancelled"
    assert TurnTrace.objects.get(message=assistant).data["cancelled"] is True
    assert restored is signal.default_int_handler  # the command put back the handler it found


# --- ragchat_plugins ------------------------------------------------------------------------


def test_plugins_lists_builtins_components_in_call_order_and_profiles():
    out, _ = run("ragchat_plugins", "--json")
    data = json.loads(out)

    names = [p["name"] for p in data["plugins"]]
    assert names == list(plugins.DEFAULT_PLUGINS)  # load order
    assert all(p["origin"] == "built-in" for p in data["plugins"])
    memory = next(p for p in data["plugins"] if p["name"] == "django_ragchat.stages.memory")
    assert memory["hooks"] == ["register_memory_strategies"] and memory["builtin"] is True
    assert data["hooks"]["register_embedders"][0] == "django_ragchat.stages.embedders"
    postprocessors = data["components"]["document_postprocessor"]
    assert [c["name"] for c in postprocessors] == ["similarity_threshold", "top_k"]
    assert [c["order"] for c in postprocessors] == sorted(c["order"] for c in postprocessors)
    assert data["components"]["llm"][0] == {
        "name": "extractive", "order": 100, "index": data["components"]["llm"][0]["index"],
        "plugin": "django_ragchat.stages.llms", "class": "django_ragchat.stages.llms.ExtractiveAnswerer",
        "enabled_by_default": True,
    }
    default = data["profiles"]["default"]
    assert list(default)[:5] == ["title", "advisors", "guardrails", "memory", "query_transformers"]
    assert default["title"] == "default"  # none set: its name
    assert default["advisors"] == []  # none built in
    assert default["llm"] == ["extractive"] and default["query_transformers"] == ["followup"]
    assert data["errors"] == []

    text, _ = run("ragchat_plugins")
    assert "django_ragchat.stages.memory (built-in): register_memory_strategies" in text
    assert "    extractive  order=100" in text and "Profiles:\n  default:\n" in text


def test_plugins_shows_a_settings_plugin_and_broken_profiles(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.test_commands"],
                              PROFILES={"default": {}, "slow": {"llm": "slow"}, "broken": {"llm": "nosuch"}})
    data = json.loads(run("ragchat_plugins", "--json")[0])
    plugin = next(p for p in data["plugins"] if p["name"] == "tests.test_commands")
    assert plugin["origin"] == "settings" and plugin["hooks"] == ["register_llm_backends"]
    # Settings plugins load after the built-in ones: called after them, registered after them.
    assert data["hooks"]["register_llm_backends"][0] == "django_ragchat.stages.llms"
    assert data["hooks"]["register_llm_backends"][-1] == "tests.test_commands"
    llms = {c["name"]: c for c in data["components"]["llm"]}
    assert llms["slow"]["plugin"] == "tests.test_commands"
    assert llms["slow"]["index"] > llms["extractive"]["index"]
    assert data["profiles"]["slow"]["llm"] == ["slow"]
    assert "No llm named 'nosuch'" in data["profiles"]["broken"]["error"]


def test_plugins_lists_the_tools_and_each_profiles(ragchat_settings_override):
    """A plugin author's trial: tools were listed nowhere, nor which profile offers them."""
    ragchat_settings_override(PLUGINS=["tests.tool_plugins"],
                              PROFILES={"default": {}, "desk": {"tools": ["weather"], "title": "Front desk"}})
    data = json.loads(run("ragchat_plugins", "--json")[0])
    weather = next(t for t in data["tools"] if t["name"] == "weather")
    assert weather["plugin"] == "tests.tool_plugins" and weather["requires_confirmation"] is False
    assert next(t for t in data["tools"] if t["name"] == "send_email")["requires_confirmation"] is True
    assert data["profiles"]["desk"]["tools"] == ["weather"] and data["profiles"]["default"]["tools"] == []
    text, _ = run("ragchat_plugins")
    assert "Tools (register_tools), by name:\n" in text and "  weather  from tests.tool_plugins (" in text
    assert "    tools: weather" in text
    # Each profile by its name, the key of the settings, with the title people see.
    assert data["profiles"]["desk"]["title"] == "Front desk" and "\n  desk (Front desk):\n" in text
    assert "\n  default:\n" in text


# --- ragchat_purge --------------------------------------------------------------------------


def aged(days: float, **fields) -> Conversation:
    """A conversation with two messages, a trace and a memory record, last active ``days`` ago."""
    conversation = Conversation.objects.create(**fields)
    Message.objects.bulk_create([Message(conversation=conversation, seq=1, role="user", content="hi"),
                                 Message(conversation=conversation, seq=2, role="assistant", content="hello")])
    answer = conversation.messages.get(seq=2)
    TurnTrace.objects.create(message=answer, profile="default", data={})
    MessageSource.objects.create(message=answer, rank=1, score=0.5)
    MemoryRecord.objects.create(conversation=conversation, kind="summary", content="said hi")
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now() - timedelta(days=days))
    return conversation


def test_purge_deletes_only_expired_anonymous_conversations(user):
    old_anonymous = [aged(31), aged(45, session_key="s")]
    recent_anonymous = aged(29)
    old_owned = aged(400, owner=user)
    user_memory = MemoryRecord.objects.create(user=user, kind="fact", content="likes tablets")

    out, _ = run("ragchat_purge", "--dry-run")
    assert out.strip() == "Would delete 2 conversations, 4 messages, 2 memory records (dry run: nothing deleted)."
    assert Conversation.objects.count() == 4

    out, _ = run("ragchat_purge", "--batch-size", "1")
    assert out.strip() == "Deleted 2 conversations, 4 messages, 2 memory records."
    assert set(Conversation.objects.values_list("pk", flat=True)) == {recent_anonymous.pk, old_owned.pk}
    assert not Message.objects.filter(conversation__in=old_anonymous).exists()
    assert TurnTrace.objects.count() == MessageSource.objects.count() == 2
    assert MemoryRecord.objects.filter(pk=user_memory.pk).exists()

    assert run("ragchat_purge")[0].strip() == "Deleted 0 conversations, 0 messages, 0 memory records."


def test_purge_says_one_in_the_singular(user):
    """An outside user's trial (a dental practice site): "Marked 1 answers interrupted"."""
    conversation = aged(40)
    Message.objects.filter(conversation=conversation, seq=1).delete()
    Message.objects.filter(conversation=conversation).update(status="streaming",
                                                             lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert run("ragchat_purge", "--leases-only", "--dry-run")[0].strip() == (
        "Would mark 1 answer interrupted (dry run).")
    assert run("ragchat_purge", "--dry-run")[0].strip().splitlines() == [
        "Would mark 1 answer interrupted (dry run).",
        "Would delete 1 conversation, 1 message, 1 memory record (dry run: nothing deleted)."]
    assert run("ragchat_purge", "--leases-only")[0].strip() == (
        "Marked 1 answer interrupted (its worker stopped renewing it).")
    assert run("ragchat_purge", "--leases-only")[0].strip() == (
        "Marked 0 answers interrupted (their worker stopped renewing them).")
    assert run("ragchat_purge")[0].strip() == "Deleted 1 conversation, 1 message, 1 memory record."


def test_purge_older_than_days_overrides_the_anonymous_retention_for_one_run(user, ragchat_settings_override):
    ragchat_settings_override(USER_RETENTION_DAYS=100)
    recent, week_old, owned_old = aged(1), aged(8), aged(150, owner=user)
    owned_recent = aged(8, owner=user)

    out, _ = run("ragchat_purge", "--older-than-days", "7", "--dry-run")
    assert out.startswith("Would delete 2 conversations")
    out, _ = run("ragchat_purge", "--older-than-days", "7")
    assert out.strip() == "Deleted 2 conversations, 4 messages, 2 memory records."
    assert set(Conversation.objects.values_list("pk", flat=True)) == {recent.pk, owned_recent.pk}
    assert not Conversation.objects.filter(pk__in=[week_old.pk, owned_old.pk]).exists()

    with pytest.raises(CommandError, match="0 or more"):
        run("ragchat_purge", "--older-than-days", "-1")


def test_ragchat_plugins_piped_into_a_reader_that_leaves_ends_without_a_traceback():
    """``manage.py ragchat_plugins | head`` (an outside user's trial ended in a BrokenPipeError
    traceback): here the reader leaves before the first line, as ``| head -0`` does."""
    process = subprocess.Popen([sys.executable, "manage.py", "ragchat_plugins"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before Django has even started: every write meets a closed pipe
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
