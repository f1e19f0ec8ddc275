"""Background work on Django's tasks framework.

django-ragchat never starts threads of its own for work that can wait: it enqueues tasks on the
backend named by ``RAGCHAT["TASK_BACKEND"]`` (an alias of the site's ``TASKS`` setting,
``"default"`` unless set). On Django 6 that is ``django.tasks``; on Django 5.2 the
``django-tasks`` backport, which has the same API.

* With Django's default, the **immediate** backend, a task runs as it is enqueued, in the
  process that enqueued it: nothing else to run, which is what the demo and small sites want.
* With a backend that runs tasks elsewhere (``django_tasks_db.DatabaseBackend`` and its
  ``manage.py db_worker``, or any other), the work leaves the request: summaries are folded
  by the worker, large uploads answer 202 with a task id whose status the API reports, and
  ``ragchat_reembed --background`` returns at once.

The tasks (docs/tasks.md):

``fold_summary``         summary memory's fold of older turns (``summary_memory``);
``ingest_upload``        a document uploaded through the API (``api.views.DocumentList``);
``reembed_space``        ``ragchat_reembed --background``;
``sync_source_objects``  live sync of a model source's changed objects (``sources.live``);
``sync_source``          a whole model source again (the admin's resync action).

Their arguments and results are JSON (a requirement of every backend that stores tasks).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from django.apps import apps
from django.db import connection, transaction

from django_ragchat.conf import ragchat_settings
from django_ragchat.ingestion.pipeline import ingest_text, reembed
from django_ragchat.plugins import build_component, embedder_for
from django_ragchat.profiles import get_profile
from django_ragchat.search import postgres
from django_ragchat.sources.registry import get_source
from django_ragchat.sources.sync import parse_since, sync

try:  # Django 6.0 and later
    from django.tasks import TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import logger as framework_logger  # "django.tasks"
except ImportError:  # Django 5.2: the backport, same API
    from django_tasks import TaskResult, TaskResultStatus, task, task_backends
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import logger as framework_logger  # "django_tasks"

__all__ = [
    "TaskResult", "TaskResultStatus", "TaskResultDoesNotExist", "enqueue", "fold_summary", "ingest_upload",
    "pending", "reembed_space", "result_of", "runs_in_background", "sync_source", "sync_source_objects",
]

logger = logging.getLogger(__name__)

#: Set while ``enqueue`` runs one of the app's tasks on the spot (the immediate backend).
_on_the_spot: contextvars.ContextVar[bool] = contextvars.ContextVar("ragchat_task_on_the_spot", default=False)


class QuietOnTheSpot(logging.Filter):
    """Leaves out the tasks framework's routine lines (enqueued, RUNNING, SUCCESSFUL: DEBUG and
    INFO) about django-ragchat's own tasks that the immediate backend runs inside ``enqueue``:
    with ``DEBUG`` on, Django's console handler printed two per saved object of a model source
    (live sync) in ``manage.py shell``, an import script or ``runserver``. Everything else passes:
    a failed task (ERROR, with its traceback), the site's own tasks, and the app's tasks run by a
    worker. ``logging.getLogger("django_ragchat.tasks")`` at ``DEBUG`` lets these through too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not _on_the_spot.get() or logger.isEnabledFor(logging.DEBUG):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not (len(args) > 1 and str(args[1]).startswith(f"{__name__}."))  # (id, module path, ...)


def quiet_on_the_spot_task_logs() -> None:
    """Add ``QuietOnTheSpot`` to the tasks framework's logger (once; ``AppConfig.ready``)."""
    if not any(isinstance(f, QuietOnTheSpot) for f in framework_logger.filters):
        framework_logger.addFilter(QuietOnTheSpot())


def backend():
    """The task backend django-ragchat enqueues on (``RAGCHAT["TASK_BACKEND"]``)."""
    return task_backends[ragchat_settings.TASK_BACKEND]


def runs_in_background() -> bool:
    """True when enqueued tasks run elsewhere and their results can be read back later (not the
    immediate backend, which runs them on the spot)."""
    return bool(backend().supports_get_result)


def enqueue(task_, *args: Any, **kwargs: Any) -> TaskResult:
    """Enqueue ``task_`` on django-ragchat's backend. On the immediate backend, which runs it
    here and now, without the framework's per-task log lines (``QuietOnTheSpot``)."""
    token = _on_the_spot.set(isinstance(backend(), ImmediateBackend))
    try:
        return task_.using(backend=ragchat_settings.TASK_BACKEND).enqueue(*args, **kwargs)
    finally:
        _on_the_spot.reset(token)


def result_of(task_, result_id: str) -> TaskResult | None:
    """The result of an earlier ``enqueue`` of ``task_``; ``None`` when there is none (unknown,
    malformed id, another task's id, or a backend that keeps no results)."""
    if not runs_in_background():
        return None
    try:
        return task_.using(backend=ragchat_settings.TASK_BACKEND).get_result(result_id)
    except (TaskResultDoesNotExist, TaskResultMismatch, ValueError):
        return None
    except Exception as exc:  # e.g. a database backend given an id that is not a UUID
        if type(exc).__name__ == "ValidationError":
            return None
        raise


def pending(task_, first_argument: Any) -> int | None:
    """How many ``task_`` tasks whose first argument is ``first_argument`` wait or run on
    django-ragchat's backend; ``None`` when the backend keeps no list to count (only
    django-tasks-db's ``DatabaseBackend`` does: the immediate backend never has any waiting)."""
    alias = ragchat_settings.TASK_BACKEND
    if not apps.is_installed("django_tasks_db") or type(backend()).__module__.split(".")[0] != "django_tasks_db":
        return None
    config = next(c for c in apps.get_app_configs() if c.name == "django_tasks_db")  # its label differs
    results = config.get_model("DBTaskResult")
    return results.objects.filter(
        task_path=task_.module_path, backend_name=alias, args_kwargs__args__0=first_argument,
        status__in=[TaskResultStatus.READY, TaskResultStatus.RUNNING]).count()


# --- The tasks -----------------------------------------------------------------------------------


@task
def fold_summary(profile_name: str, conversation_id: str, budget_tokens: int, until_seq: int) -> dict | None:
    """Fold a conversation's older turns into its summary (``SummaryMemory.fold``)."""

    profile = get_profile(profile_name)
    memory = build_component(profile, "memory", profile.memory)
    # Not isinstance(memory, SummaryMemory): summary_memory imports this module (no cycles).
    if not callable(getattr(memory, "fold", None)):  # the profile changed since the turn
        return None
    record = memory.fold(conversation_id, budget_tokens, until_seq=until_seq)
    return {"memory_record_id": record.pk, "covers_until_seq": record.covers_until_seq} if record else None


@task
def ingest_upload(source: str, text: str, title: str, content_type: str, profile: str | None,
                  access: list[str] | None = None) -> dict:
    """Ingest a document uploaded through the API or the admin (``ingestion.pipeline.ingest_text``);
    ``access``: who may read it (tokens; ``None``: everyone)."""

    result = ingest_text(source, text, title=title, content_type=content_type, profile=profile, access=access)
    return {"document_id": result.document_id, "outcome": result.status}


@task
def reembed_space(profile: str | None = None, batch_size: int = 64, build_index: bool = True) -> dict:
    """Embed the stored chunks into a profile's embedder's space (``ragchat_reembed``)."""

    embedder = embedder_for(get_profile(profile))
    report = reembed(embedder, batch_size=batch_size)
    result = {"space": embedder.space, "summary": report.summary(),
              "failed": [{"source": r.source, "reason": r.reason} for r in report.failed]}
    if build_index and connection.vendor == "postgresql" and not report.failed:
        status, created = postgres.create_hnsw_index(embedder.space)
        result["index"] = status.name
    return result


@task
def sync_source_objects(source_name: str, pks: list[str]) -> dict:
    """Sync these objects of a model source (live sync, ``sources.live``): index, update or remove
    each as ``sources.sync`` does. A source no longer registered is skipped."""

    try:
        source = get_source(source_name)
    except KeyError as exc:
        logger.warning("Skipping the sync of %d object(s): %s", len(pks), exc)
        return {"source": source_name, "skipped": str(exc)}
    return sync(source, pks=pks).as_dict()


@task
def sync_source(source_name: str, since: str | None = None) -> dict:
    """Sync a whole model source (``since``: only the objects changed since, see
    ``sources.sync.parse_since``), as ``manage.py ragchat_sync`` does, building the HNSW index
    of a space it wrote that has none at the end (PostgreSQL)."""

    source = get_source(source_name)
    report = sync(source, since=parse_since(since) if since else None)
    if report.spaces_written and connection.vendor == "postgresql":
        # As ragchat_sync: a space without its vector index gets it once, at the end of the load.
        spaces = sorted(report.spaces_written)
        transaction.on_commit(lambda: postgres.build_missing_hnsw_indexes(spaces))
    return report.as_dict()
