"""Model sources in the admin: each source's state, and a resync action.

One row per registered source (rows are made for sources registered since the last visit):
its model, the objects its queryset holds now, the documents and chunks indexed, the last full
or ``--since`` sync and what it did, the last live sync, the changes waiting for a worker
(counted where the task backend keeps a list: django-tasks-db), and the last error. "Resync"
enqueues a whole sync of each selected source (on the immediate backend it runs before the
page answers). Staff need ``change_sourcestate`` to resync (``ragchat_admin_group --documents``).

The counts are what the member of staff looking may see, as in the lists they link to: documents
and chunks they may read, and the model's objects only with its ``view`` permission (a reviewer
without ``orders.view_order`` is not told how many orders there are) or when every object is a
document they may read (a public source).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import OuterRef
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime

from django_ragchat import tasks
from django_ragchat.access import principals_of_user_id
from django_ragchat.admin.base import RagchatAdmin, count_subquery, short
from django_ragchat.models import Chunk, Document, SourceState
from django_ragchat.sources import registry as source_registry


def _mark_viewer(state: SourceState, user) -> SourceState:
    """Remember on ``state`` whether ``user`` may view its source's model (Django's ``view``
    permission), which decides whether its object count is shown."""
    source = source_registry.sources().get(state.name)
    model = source.get_model() if source else None
    state.viewer_may_view_model = bool(model) and user.has_perm(f"{model._meta.app_label}.view_{model._meta.model_name}")
    return state


class SourceStateChangeList(ChangeList):
    """Marks each listed source with what the member of staff looking may count."""

    def get_results(self, request):
        super().get_results(request)
        self.result_list = [_mark_viewer(state, request.user) for state in self.result_list]


@admin.register(SourceState)
class SourceStateAdmin(RagchatAdmin):
    list_display = ("name", "source_model", "objects", "indexed", "chunks", "last_sync_summary", "last_live_sync_at",
                    "pending_changes", "error")
    fields = ("name", "source_model", "objects", "indexed", "chunks", "last_sync_summary", "last_sync_started_at",
              "last_sync_finished_at", "last_live_sync_at", "pending_changes", "last_error")
    readonly_fields = fields
    actions = ["resync"]

    def get_queryset(self, request):
        viewer = principals_of_user_id(request.user.pk)
        documents = Document.objects.filter(origin=OuterRef("name"), access__visible_to=viewer)
        chunks = Chunk.objects.filter(document__origin=OuterRef("name"), access__visible_to=viewer)
        every_document = Document.objects.filter(origin=OuterRef("name"))
        return super().get_queryset(request).annotate(
            _documents=count_subquery(documents, "origin"), _chunks=count_subquery(chunks, "document__origin"),
            _all_documents=count_subquery(every_document, "origin"))

    def get_changelist(self, request, **kwargs):
        return SourceStateChangeList

    def get_object(self, request, object_id, from_field=None):
        state = super().get_object(request, object_id, from_field)
        return state and _mark_viewer(state, request.user)

    def changelist_view(self, request, extra_context=None):
        names = list(source_registry.sources())
        if names:  # a source registered since the last visit gets its row
            SourceState.objects.bulk_create([SourceState(name=n) for n in names], ignore_conflicts=True)
        elif request.method == "GET":  # "0 model sources" alone left a new site's staff guessing
            messages.info(request, "No model source is registered. A source declares how one of your models "
                                   "becomes documents the assistant searches, and who may read each: see "
                                   "docs/sources.md of django-ragchat (the register_sources hook).")
        return super().changelist_view(request, extra_context)

    def has_add_permission(self, request):
        return False  # a row per registered source, made by the list itself

    def has_change_permission(self, request, obj=None):
        return False  # nothing to edit: the action resyncs

    def has_delete_permission(self, request, obj=None):
        # A registered source's row comes back on the next visit: only a source no longer
        # registered may go, from its own page (no "Delete selected" on the list).
        return obj is not None and self._source(obj) is None and super().has_delete_permission(request, obj)

    def has_resync_permission(self, request):
        return request.user.has_perm("django_ragchat.change_sourcestate")

    def _source(self, obj):
        return source_registry.sources().get(obj.name)

    @admin.display(description="model")
    def source_model(self, obj):
        source = self._source(obj)
        return source.get_model()._meta.label if source else "(no longer registered)"

    @admin.display(description="objects now")
    def objects(self, obj):
        source = self._source(obj)
        if source is None:
            return "—"
        count = source.get_queryset().count()
        # Without the model's view permission the count is shown only when it tells nothing more
        # than the documents they may read: every object indexed, and readable by them (a public source).
        if getattr(obj, "viewer_may_view_model", False) or obj._documents == obj._all_documents == count:
            return count
        return "(you may not view these objects)"

    @admin.display(description="indexed (readable by you)", ordering="_documents")
    def indexed(self, obj):
        url = reverse("admin:django_ragchat_document_changelist") + f"?origin__exact={obj.name}"
        hidden = obj._all_documents - obj._documents
        if hidden and getattr(obj, "viewer_may_view_model", False):
            # A trial's superuser read "0" beside customers' bookings as nothing indexed: those
            # documents are their customers' own. Counted only for who may view the objects anyway.
            return format_html('<a href="{}">{}</a> (and {} you may not read)', url, obj._documents, hidden)
        return format_html('<a href="{}">{}</a>', url, obj._documents)

    @admin.display(description="chunks (readable by you)", ordering="_chunks")
    def chunks(self, obj):
        return obj._chunks

    @admin.display(description="last sync")
    def last_sync_summary(self, obj):
        # Not named last_sync: the admin shows a model field before a method of the same name,
        # and the list showed the field's raw JSON.
        if not obj.last_sync_finished_at:
            return "never"
        counts = (obj.last_sync or {}).get("counts", {})
        done = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
        # Written as the admin writes the row's other times (last live sync), in the site's zone.
        finished = date_format(localtime(obj.last_sync_finished_at), "DATETIME_FORMAT")
        return format_html("{} ({}): {}", finished, (obj.last_sync or {}).get("mode", ""), done or "nothing to do")

    @admin.display(description="pending changes")
    def pending_changes(self, obj):
        count = tasks.pending(tasks.sync_source_objects, obj.name)
        return "—" if count is None else count  # this task backend keeps no list (docs/admin.md)

    @admin.display(description="last error")
    def error(self, obj):
        return short(obj.last_error) if obj.last_error else ""

    @admin.action(description="Resync the selected sources", permissions=["resync"])
    def resync(self, request, queryset):
        for state in queryset:
            if self._source(state) is None:
                self.message_user(request, f"{state.name} is no longer registered.", messages.WARNING)
                continue
            result = tasks.enqueue(tasks.sync_source, state.name)
            if tasks.runs_in_background():
                self.message_user(request, f"Queued a resync of {state.name} (task {result.id}).", messages.SUCCESS)
            elif result.status == tasks.TaskResultStatus.SUCCESSFUL:
                counts = result.return_value.get("counts", {})
                self.message_user(request, f"Resynced {state.name}: " + ", ".join(
                    f"{n} {name}" for name, n in counts.items()), messages.SUCCESS)
            else:
                self.message_user(request, f"The resync of {state.name} failed; see the logs.", messages.ERROR)
