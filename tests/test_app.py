"""The app's Django integration: settings, system checks, migrations, retention, admin."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_ragchat import checks
from django_ragchat.conf import ragchat_settings
from django_ragchat.models import Conversation, MemoryRecord, Message, expired_conversations
from django_ragchat.models import MessageSource as MessageSourceNow


def ids(errors):
    return [e.id for e in errors]


def test_settings_have_documented_defaults_and_reload(ragchat_settings_override):
    assert ragchat_settings.MAX_MESSAGE_CHARS == 16_000
    ragchat_settings_override(MAX_MESSAGE_CHARS=10)
    assert ragchat_settings.MAX_MESSAGE_CHARS == 10
    with pytest.raises(AttributeError):
        ragchat_settings.NOT_A_SETTING  # noqa: B018


def test_default_configuration_passes_every_check():
    assert checks.check_settings() + checks.check_plugins() + checks.check_profiles() == []


def test_unknown_setting_key_is_reported(ragchat_settings_override):
    ragchat_settings_override(MAX_MESAGE_CHARS=10)
    errors = checks.check_settings()
    assert ids(errors) == ["ragchat.E001"]
    assert "MAX_MESAGE_CHARS" in errors[0].msg and "MAX_MESSAGE_CHARS" in errors[0].hint
    assert errors[0].msg.endswith("(did you mean 'MAX_MESSAGE_CHARS'?).")


@pytest.mark.parametrize("profiles, fragment", [
    ({"default": {"sistem_prompt": "x"}}, "unknown option(s) ['sistem_prompt'] (did you mean 'system_prompt'?)"),
    ({"default": {"llm": "gpt-9"}}, "No llm named 'gpt-9'"),
    ({"default": {"retrievers": ["vector", "bm99"]}}, "No retriever named 'bm99'"),
    ({"default": {"empty_context": "maybe"}}, "empty_context must be one of"),
    ({"default": {"top_k": 20, "retrieval_k": 5}}, "retrieval_k at least top_k"),
])
def test_bad_profiles_are_system_check_errors(ragchat_settings_override, profiles, fragment):
    ragchat_settings_override(PROFILES=profiles)
    errors = checks.check_profiles()
    assert ids(errors) == ["ragchat.E002"]
    assert fragment in errors[0].msg
    assert errors[0].hint


def test_missing_default_profile_is_reported(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"support": {}})
    assert ids(checks.check_profiles()) == ["ragchat.E003"]


def test_wrongly_typed_settings_are_reported(ragchat_settings_override):
    ragchat_settings_override(MAX_MESSAGE_CHARS="big", ANONYMOUS_RETENTION_DAYS=-1,
                              CONVERSATION_PERMISSION="nowhere.callable")
    assert sorted(ids(checks.check_settings())) == ["ragchat.E006", "ragchat.E007", "ragchat.E007"]


@pytest.mark.parametrize("key, value, takes", [
    # A new user's trial: each passed the check, then failed or refused every message.
    ("TURNS_PER_MINUTE", "thirty", "a whole number, 0 or more"),
    ("TURNS_PER_MINUTE", -1, "a whole number, 0 or more"),
    ("MAX_CONCURRENT_STREAMS", "3", "a whole number, 0 or more"),
    ("ALLOW_ANONYMOUS", "no", "True or False"),  # a truthy string: it turned anonymous chat on
    ("LOAD_ENTRY_POINTS", 0, "True or False"),
    ("CITED_SOURCES_ONLY", 1, "one of True, False, 'signed_out'"),  # 1 == True, yet not a bool
    ("MAX_MESSAGE_CHARS", True, "a whole number, 1 or more"),
    ("SHUTDOWN_GRACE_SECONDS", float("inf"), "a number of seconds above 0"),
    ("USER_RETENTION_DAYS", "90", "a number of days, 0 or more, or None (kept forever)"),
    ("TASK_BACKEND", "", "a non-empty string"),
    ("DEFAULT_PROFILE", 3, "a non-empty string"),  # not E003 as well: one mistake, one error
    ("CONVERSATION_PERMISSION", None, "the dotted path of a callable, a string"),  # not imported
    ("PLUGINS", "tests.settings_plugin", "a list of dotted paths (strings)"),  # not loaded letter by letter
])
def test_a_setting_of_the_wrong_type_or_range_is_one_e007_naming_it_its_value_and_what_it_takes(
        ragchat_settings_override, key, value, takes):
    ragchat_settings_override(**{key: value})
    errors = checks.check_settings() + checks.check_profiles() + checks.check_plugins()
    assert ids(errors) == ["ragchat.E007"]
    assert errors[0].msg == f"RAGCHAT[{key!r}] must be {takes}, not {value!r}."
    assert errors[0].hint == f"Remove it to use the default, {ragchat_settings.defaults[key]!r}."


def test_every_setting_but_the_profiles_has_a_kind_its_default_passes():
    from django_ragchat.conf import DEFAULTS, KINDS

    assert set(KINDS) == set(DEFAULTS) - {"PROFILES"}  # PROFILES: E002, django_ragchat.profiles
    assert ragchat_settings.problems() == []


def test_settings_md_says_what_each_setting_takes():
    import re
    from pathlib import Path

    from django_ragchat.conf import KINDS

    section = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text().split(
        "### What each setting takes")[1]
    documented = {}  # setting -> the first cell of its row: what it takes
    for row in re.findall(r"^\| (.+) \| (.+) \|$", section, re.MULTILINE):
        documented |= dict.fromkeys(re.findall(r"`([A-Z_]+)`", row[1]), row[0])
    assert {name: documented.get(name, "")[:len(kind.takes)] for name, kind in KINDS.items()} == {
        name: kind.takes for name, kind in KINDS.items()}


@pytest.mark.django_db  # Django 6 runs model checks (JSONField support) against the databases
def test_every_wrong_setting_is_reported_in_one_run(ragchat_settings_override):
    from django.core.management.base import SystemCheckError

    ragchat_settings_override(TURNS_PER_MINUTE="thirty", MAX_CONCURRENT_STREAMS="3", ALLOW_ANONYMOUS="no",
                              PLUGINS=5)  # a number: the plugins' check read it without a traceback
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    for key in ("TURNS_PER_MINUTE", "MAX_CONCURRENT_STREAMS", "ALLOW_ANONYMOUS", "PLUGINS"):
        assert f"(ragchat.E007) RAGCHAT[{key!r}] must be" in str(raised.value)


@pytest.mark.django_db  # Django 6 runs model checks (JSONField support) against the databases
def test_manage_py_check_reports_instead_of_raising(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"llm": "nope"}})
    from django.core.management.base import SystemCheckError

    with pytest.raises(SystemCheckError, match="ragchat.E002"):
        call_command("check")


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()
    call_command("makemigrations", "django_ragchat", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_sources_migration_saves_each_sources_chunk_access_and_none_for_a_chunk_gone(user):
    """0011: a source whose chunk is still there takes its access (a customer's booking stays
    theirs once cancelled); one whose chunk was already gone has none saved, so the admin names
    it to no one rather than to everyone."""
    executor = MigrationExecutor(connection)
    executor.migrate([("django_ragchat", "0010_stop_requests")])
    old = executor.loader.project_state([("django_ragchat", "0010_stop_requests")]).apps
    Document, Chunk = old.get_model("django_ragchat", "Document"), old.get_model("django_ragchat", "Chunk")
    Message, MessageSource = old.get_model("django_ragchat", "Message"), old.get_model("django_ragchat", "MessageSource")
    Conversation = old.get_model("django_ragchat", "Conversation")
    document = Document.objects.create(source="bookings:7", title="Your booking", checksum="x")
    chunk = Chunk.objects.create(document=document, ordinal=0, text="Brake check", space="s", access=[f"user:{user.pk}"])
    message = Message.objects.create(conversation=Conversation.objects.create(owner_id=user.pk), seq=2,
                                     role="assistant", content="At 14:00 [1].")
    MessageSource.objects.create(message=message, chunk=chunk, rank=1, score=0.5)
    MessageSource.objects.create(message=message, chunk=None, rank=2, score=0.4, title="Gone")
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    saved = dict(MessageSourceNow.objects.filter(message_id=message.pk).values_list("rank", "access"))
    assert saved == {1: [f"user:{user.pk}"], 2: []}


@pytest.mark.django_db
def test_a_worker_of_the_release_before_0011_still_saves_its_answers_sources(user):
    """During an upgrade, a worker still running the code before migration 0011 inserts sources
    without ``access``: the column's database default takes them (no access saved), not an error."""
    message = Message.objects.create(conversation=Conversation.objects.create(owner=user), seq=2, role="assistant",
                                     content="At 14:00 [1].")
    table = MessageSourceNow._meta.db_table
    with connection.cursor() as cursor:  # the columns the release before 0011 wrote
        cursor.execute(f"INSERT INTO {table} (message_id, chunk_id, rank, score, cited, source, title) "
                       "VALUES (%s, NULL, 1, 0.5, %s, 'bookings:7', 'Your booking')", [message.pk, True])
    assert MessageSourceNow.objects.get(message=message).access == []


@pytest.mark.django_db
def test_retention_expires_old_anonymous_conversations_only(user):
    old = timezone.now() - timedelta(days=40)
    anon_old = Conversation.objects.create(session_key="s1")
    anon_new = Conversation.objects.create(session_key="s2")
    user_old = Conversation.objects.create(owner=user)
    Conversation.objects.filter(pk__in=[anon_old.pk, user_old.pk]).update(updated_at=old)
    assert list(expired_conversations()) == [anon_old]
    assert anon_new not in expired_conversations()


@pytest.mark.django_db
def test_memory_records_need_a_scope(user):
    from django.db import IntegrityError

    MemoryRecord.objects.create(user=user, kind="fact", content="Prefers metric units")
    with pytest.raises(IntegrityError):
        MemoryRecord.objects.create(kind="fact", content="belongs to nobody")


@pytest.mark.django_db
def test_message_sequence_is_unique_per_conversation(user):
    from django.db import IntegrityError, transaction

    conversation = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.create(conversation=conversation, seq=1, role="user", content="b")


@pytest.mark.django_db
def test_admin_pages_render_for_staff(client, staff_user, user):
    staff_user.is_superuser = True
    staff_user.save()
    conversation = Conversation.objects.create(owner=user, title="Hello")
    Message.objects.create(conversation=conversation, seq=1, role="user", content="<b>hi</b>")
    MemoryRecord.objects.create(conversation=conversation, kind="summary", content="They said hi.")
    client.force_login(staff_user)
    for url in ("/admin/django_ragchat/conversation/", f"/admin/django_ragchat/conversation/{conversation.pk}/change/",
                "/admin/django_ragchat/message/", "/admin/django_ragchat/memoryrecord/",
                "/admin/django_ragchat/document/", "/admin/django_ragchat/chunk/", "/admin/django_ragchat/turntrace/"):
        response = client.get(url)
        assert response.status_code == 200, url
    # Staff can correct long-term memory.
    record = MemoryRecord.objects.get()
    response = client.post(f"/admin/django_ragchat/memoryrecord/{record.pk}/change/", {
        "kind": "summary", "content": "They greeted us.", "conversation": conversation.pk, "user": "",
        "covers_until_seq": "", "metadata": "{}",
    })
    assert response.status_code == 302
    record.refresh_from_db()
    assert record.content == "They greeted us."


@pytest.mark.django_db
def test_admin_is_closed_to_non_staff(client, user):
    client.force_login(user)
    response = client.get("/admin/django_ragchat/conversation/")
    assert response.status_code == 302 and "/login/" in response["Location"]


@pytest.mark.django_db
def test_saving_a_stale_conversation_never_rewinds_its_sequence_counter(user):
    conversation = Conversation.objects.create(owner=user)
    stale = Conversation.objects.get(pk=conversation.pk)
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=7)
    stale.title = "Renamed"
    stale.save()
    conversation.refresh_from_db()
    assert (conversation.title, conversation.last_seq) == ("Renamed", 7)


def test_the_tests_keep_their_files_out_of_the_system_temp_folder(tmp_path):
    """README: tests leave nothing in the system's temp folder (a run used to leave 84 MB of
    pytest-of-<user>/ there)."""
    import tempfile
    from pathlib import Path

    var = Path(__file__).resolve().parent.parent / "var"
    assert tmp_path.is_relative_to(var), tmp_path
    assert Path(tempfile.gettempdir()).resolve().is_relative_to(var.resolve()), tempfile.gettempdir()
