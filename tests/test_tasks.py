"""Background work on Django's tasks framework: uploads and re-embedding, on the immediate
backend (the default: no worker) and on django-tasks-db's database backend with its worker."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from django_ragchat import tasks
from django_ragchat.models import Chunk, Document

pytestmark = pytest.mark.django_db(transaction=True)

BIG = "# Trail Guide\n\n## Routes\n\n" + "The ridge route climbs 900 metres past three lakes. " * 120


@pytest.fixture
def staff_client(client, uploader):
    client.force_login(uploader)
    return client


def upload(client, text: str, name: str = "guide.md"):
    return client.post("/api/ragchat/documents/", {"file": SimpleUploadedFile(name, text.encode())})


def run_worker() -> None:
    call_command("db_worker", "--batch", "--backend", "database", "--no-startup-delay", verbosity=0)


def test_on_the_immediate_backend_an_upload_is_ingested_at_once(staff_client, ragchat_settings_override):
    ragchat_settings_override(BACKGROUND_INGEST_BYTES=100)
    assert not tasks.runs_in_background()
    response = upload(staff_client, BIG)
    assert response.status_code == 201, response.content
    assert response.json()["outcome"] == "created"


def test_with_a_worker_a_large_upload_answers_202_and_its_task_says_how_it_went(staff_client,
                                                                                ragchat_settings_override):
    ragchat_settings_override(TASK_BACKEND="database", BACKGROUND_INGEST_BYTES=1000)
    assert tasks.runs_in_background()
    small = upload(staff_client, "# Note\n\nShort.", name="note.md")
    assert small.status_code == 201  # under the threshold: at once, as before

    response = upload(staff_client, BIG)
    assert response.status_code == 202, response.content
    task = response.json()["task"]
    assert task["status"] == "READY" and task["result"] is None
    assert not Document.objects.filter(source="upload/guide.md").exists()
    assert staff_client.get(task["url"]).json()["status"] == "READY"

    run_worker()
    done = staff_client.get(task["url"]).json()
    assert done["status"] == "SUCCESSFUL", done
    document = Document.objects.get(source="upload/guide.md")
    assert done["result"] == {"document_id": document.pk, "outcome": "created"}
    assert Chunk.objects.filter(document=document).count() >= 2


@pytest.mark.parametrize("task_id", ["nope", "00000000-0000-0000-0000-000000000000", "%00"])
def test_an_unknown_task_is_a_404(staff_client, ragchat_settings_override, task_id):
    ragchat_settings_override(TASK_BACKEND="database")
    response = staff_client.get(f"/api/ragchat/documents/tasks/{task_id}/")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_a_task_status_is_for_those_who_may_upload(user, staff_client, ragchat_settings_override):
    from django.test import Client

    ragchat_settings_override(TASK_BACKEND="database", BACKGROUND_INGEST_BYTES=1000)
    url = upload(staff_client, BIG).json()["task"]["url"]
    other = Client()
    other.force_login(user)
    assert other.get(url).status_code == 403
    assert Client().get(url).status_code == 403


def test_reembed_in_the_background(ragchat_settings_override, capsys, product_corpus):
    from django_tasks_db.models import DBTaskResult

    ragchat_settings_override(TASK_BACKEND="database", PROFILES={
        "default": {}, "small": {"embedder": "hashing", "options": {"hashing": {"dimension": 64}}}})
    call_command("ragchat_reembed", "--profile", "small", "--background")
    assert "Enqueued re-embedding task" in capsys.readouterr().out
    [queued] = DBTaskResult.objects.all()
    assert queued.status == "READY"
    run_worker()
    queued.refresh_from_db()
    assert queued.status == "SUCCESSFUL", queued.exception_class_path
    spaces = set(Chunk.objects.values_list("space", flat=True))
    assert len(spaces) == 2


def test_reembed_on_the_immediate_backend_runs_at_once(ragchat_settings_override, capsys, product_corpus):
    ragchat_settings_override(PROFILES={
        "default": {}, "small": {"embedder": "hashing", "options": {"hashing": {"dimension": 64}}}})
    call_command("ragchat_reembed", "--profile", "small", "--background")
    assert "runs tasks on the spot; re-embedded" in capsys.readouterr().out
    assert len(set(Chunk.objects.values_list("space", flat=True))) == 2


# --- the tasks framework's log lines -------------------------------------------------------------


@tasks.task
def site_task() -> int:
    """A task of the site's own (not django-ragchat's)."""
    return 1


@pytest.fixture
def framework_records():
    """Every record of the tasks framework's logger (``django.tasks`` on Django 6,
    ``django_tasks`` on the backport) that passes its filters, at every level."""
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler, framework = Keep(level=logging.DEBUG), tasks.framework_logger
    level = framework.level
    framework.setLevel(logging.DEBUG)
    framework.addHandler(handler)
    yield records
    framework.removeHandler(handler)
    framework.setLevel(level)


def lines(records) -> list[tuple[str, str]]:
    return [(record.levelname, record.getMessage().split(" ", 2)[2]) for record in records]


def test_the_apps_tasks_run_on_the_spot_log_only_their_failures(framework_records, ragchat_settings_override):
    """An outside user's trial on Django 6.1 (startproject's DEBUG=True): every object saved in
    ``manage.py shell`` printed "Task id=... path=django_ragchat.tasks.sync_source_objects
    state=RUNNING" and "state=SUCCESSFUL", once per model source watching it: Django's console
    handler prints the ``django.tasks`` logger's INFO lines when DEBUG is on, and live sync
    enqueues on the immediate backend, which runs the task there and then. Those routine lines
    are left out for django-ragchat's own tasks run on the spot; a failure is logged as before
    (ERROR, with its traceback), and so is every line of the site's own tasks."""
    from tests.sources_app.models import Article

    ragchat_settings_override(PLUGINS=["tests.sources_plugin"], PROFILES={"default": {"embedder": "counting"}})
    article = Article.objects.create(title="Zorbex 9", body="The Zorbex 9 costs $321.")
    assert Chunk.objects.filter(document__source__contains=str(article.pk)).exists()  # it was synced
    result = tasks.enqueue(tasks.fold_summary, "no-such-profile", "x", 100, 1)
    assert result.status == tasks.TaskResultStatus.FAILED
    site_task.enqueue()

    assert [(level, line) for level, line in lines(framework_records) if "django_ragchat" in line] == [
        ("ERROR", "path=django_ragchat.tasks.fold_summary state=FAILED")]
    assert framework_records[0].exc_info and "UnknownProfile" in framework_records[0].exc_info[0].__name__
    assert [line for _, line in lines(framework_records) if "site_task" in line] == [
        "path=tests.test_tasks.site_task enqueued backend=default",
        "path=tests.test_tasks.site_task state=RUNNING", "path=tests.test_tasks.site_task state=SUCCESSFUL"]


def test_the_apps_logger_at_debug_shows_its_tasks_lines(framework_records):
    import logging

    ours = logging.getLogger("django_ragchat.tasks")
    level = ours.level
    ours.setLevel(logging.DEBUG)
    try:
        tasks.enqueue(tasks.sync_source_objects, "no-such-source", ["1"])
    finally:
        ours.setLevel(level)
    assert [line.split(" ", 1)[1] for _, line in lines(framework_records)] == [
        "enqueued backend=default", "state=RUNNING", "state=SUCCESSFUL"]


def test_with_a_worker_enqueueing_the_apps_tasks_is_logged_as_before(framework_records, ragchat_settings_override):
    """Only what the immediate backend runs inside ``enqueue`` is quiet: a task handed to a
    worker's queue keeps the framework's line (and the worker logs as it does)."""
    ragchat_settings_override(TASK_BACKEND="database")
    tasks.enqueue(tasks.sync_source_objects, "no-such-source", ["1"])
    assert lines(framework_records) == [
        ("DEBUG", "path=django_ragchat.tasks.sync_source_objects enqueued backend=database")]
