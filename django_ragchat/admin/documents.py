"""Documents, added by uploading a file (ingestion runs), and their chunks, read-only.

Staff see the documents and chunks they may read themselves (``django_ragchat.access``), as the
documents API shows each caller theirs; each shows who may read it.
"""

from __future__ import annotations

from pathlib import Path

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, OuterRef
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from django_ragchat import tasks
from django_ragchat.access import InvalidAccess, access_tokens, principals_of_user_id
from django_ragchat.admin import views as admin_views
from django_ragchat.admin.base import RagchatAdmin, ReadOnlyAdmin, admin_link, count_subquery, deletion_summary, short
from django_ragchat.conf import ragchat_settings
from django_ragchat.ingestion.loaders import DocumentLoadError, content_type_for
from django_ragchat.ingestion.pipeline import ingest_paths, ingest_text
from django_ragchat.models import (
    Chunk,
    Document,
)
from django_ragchat.profiles import UnknownProfile
from django_ragchat.sources import get_source, sync


def readers(access) -> str:
    """A row's access for people: "everyone" for public, else its tokens."""
    tokens = list(access or ())
    if not tokens:
        return "nobody"
    return "everyone" if "public" in tokens else ", ".join(tokens)


class DocumentChangeList(ChangeList):
    """Adds each listed document's chunk count per embedding space, in one more query."""

    def get_results(self, request):
        super().get_results(request)
        self.result_list = list(self.result_list)
        spaces: dict[int, dict[str, int]] = {}
        rows = (Chunk.objects.filter(document__in=[d.pk for d in self.result_list]).order_by()
                .values_list("document_id", "space").annotate(n=Count("pk")))
        for document_id, space, n in rows:
            spaces.setdefault(document_id, {})[space] = n
        for document in self.result_list:
            document._spaces = spaces.get(document.pk, {})


class DocumentUploadForm(forms.Form):
    """The "add document" page: a file, ingested like ``POST /api/ragchat/documents/``."""

    file = forms.FileField(help_text="Markdown, reStructuredText, HTML or plain text, UTF-8.")
    source = forms.CharField(required=False, max_length=1000,
                             help_text="The document's unique name; default upload/<file name>. "
                                       "Uploading the same source again replaces the document.")
    title = forms.CharField(required=False, max_length=500, help_text="Overrides the title found in the text.")
    content_type = forms.ChoiceField(
        required=False, choices=[("", "from the file's extension"), ("markdown", "Markdown"),
                                 ("rst", "reStructuredText"), ("html", "HTML"), ("text", "plain text")])
    profile = forms.CharField(required=False, max_length=100,
                              help_text="Embed with this profile's embedder (default profile if empty).")
    access = forms.CharField(required=False, max_length=1000,
                             help_text="Who may read it, separated by spaces: staff, authenticated, user:<id>, "
                                       "group:<id>, app_label.codename (a permission). Empty: everyone.")

    max_upload_bytes = 10 * 1024 * 1024

    def clean_access(self):
        given = self.cleaned_data.get("access", "").split()
        try:
            return list(access_tokens(given)) if given else None
        except InvalidAccess as exc:
            raise ValidationError(str(exc)) from None

    def clean(self):
        cleaned = super().clean()
        upload = cleaned.get("file")
        if upload is None:
            return cleaned
        if upload.size > self.max_upload_bytes:
            raise ValidationError(f"The file is larger than {self.max_upload_bytes // (1024 * 1024)} MB.")
        content_type = cleaned.get("content_type") or content_type_for(Path(upload.name))
        if not content_type:
            raise ValidationError("Unknown file type: choose the content type.")
        raw = upload.read()
        try:
            cleaned["text"] = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError("The file is not UTF-8 text.") from None
        cleaned["content_type"] = content_type
        cleaned["source"] = cleaned.get("source") or f"upload/{upload.name}"
        return cleaned


#: How many chunks a document's page shows (the chunk list has them all).
CHUNKS_SHOWN = 20


@admin.register(Document)
class DocumentAdmin(RagchatAdmin):
    # The origin and the content type are filters, not columns: a model source's documents are
    # named "<origin>:<pk>" already, and with them the list was wider than a 1280 px window.
    list_display = ("__str__", "source", "readers", "chunk_count", "embedding_spaces", "updated_at")
    list_filter = ("origin", "content_type")
    search_fields = ("title", "source")
    fields = ("title", "source", "origin", "object_pk", "readers", "content_type", "checksum", "chunks_by_space",
              "metadata", "created_at", "updated_at", "chunk_texts")
    readonly_fields = fields
    actions = ["reingest", "delete_selected"]

    def get_changelist(self, request, **kwargs):
        return DocumentChangeList

    def get_queryset(self, request):
        return super().get_queryset(request).filter(access__visible_to=principals_of_user_id(request.user.pk)).annotate(
            _chunks=count_subquery(Chunk.objects.filter(document=OuterRef("pk")), "document"))

    @admin.display(description="who may read it")
    def readers(self, obj):
        return readers(obj.access)

    def has_change_permission(self, request, obj=None):
        return False  # a document changes by ingesting it again

    @admin.display(description="chunks", ordering="_chunks")
    def chunk_count(self, obj):
        url = reverse("admin:django_ragchat_chunk_changelist") + f"?document__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj._chunks)

    @admin.display(description="embedding spaces")
    def embedding_spaces(self, obj):
        spaces = getattr(obj, "_spaces", {})
        return format_html_join(", ", "{} ({})", sorted(spaces.items())) or "—"

    @admin.display(description="chunks by embedding space")
    def chunks_by_space(self, obj):
        rows = obj.chunks.order_by("space").values_list("space", flat=False).annotate(n=Count("pk"))
        return format_html_join(mark_safe("<br>"), "{}: {}", rows) or "no chunks"

    @admin.display(description="its text, by chunk")
    def chunk_texts(self, obj):
        # What was ingested, readable on the document's own page (a new user found it empty):
        # the chunks of one embedding space in order, each linked, the first CHUNKS_SHOWN.
        space = obj.chunks.order_by("space").values_list("space", flat=True).first()
        chunks = list(obj.chunks.filter(space=space).order_by("ordinal").defer("embedding", "analysis")
                      [:CHUNKS_SHOWN + 1])
        if not chunks:
            return "no chunks"
        items = format_html_join("", '<li><a href="{}">{}</a><div class="ragchat-text">{}</div></li>', (
            (reverse("admin:django_ragchat_chunk_change", args=[c.pk]), str(c), admin_views.chunk_snippet(c))
            for c in chunks[:CHUNKS_SHOWN]))
        more = ""
        if len(chunks) > CHUNKS_SHOWN:
            url = reverse("admin:django_ragchat_chunk_changelist") + f"?document__id__exact={obj.pk}"
            more = format_html('<p><a href="{}">All of its chunks</a></p>', url)
        return format_html('<ol class="ragchat-document-chunks">{}</ol>{}', items, more)

    def get_deleted_objects(self, objs, request):
        objs = list(objs)
        return deletion_summary(request, objs, Document, {Chunk: Chunk.objects.filter(document__in=objs).count()})

    def add_view(self, request, form_url="", extra_context=None):
        """Upload a file and ingest it (parse, chunk, embed, store), like the documents API."""
        if not self.has_add_permission(request):
            raise PermissionDenied

        form = DocumentUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            if self._ingest_in_background(request, data):
                return HttpResponseRedirect(reverse("admin:django_ragchat_document_changelist"))
            try:
                result = ingest_text(data["source"], data["text"], title=data["title"],
                                     content_type=data["content_type"], profile=data["profile"] or None,
                                     access=data["access"])
            except (DocumentLoadError, UnknownProfile) as exc:
                form.add_error(None, getattr(exc, "reason", None) or str(exc))
            except Exception as exc:  # the embedder or the database failed: nothing stored is lost
                form.add_error(None, f"The document could not be embedded or stored ({type(exc).__name__}); "
                                     "what was stored before is kept.")
            else:
                if result.status == "failed":
                    form.add_error(None, f"Ingestion failed: {result.reason}")
                else:
                    chunks = ngettext("%(n)s chunk", "%(n)s chunks", result.chunks) % {"n": f"{result.chunks:,}"}
                    self.message_user(request, f"Ingested {data['source']}: {result.status}, {chunks}.",
                                      messages.SUCCESS)
                    return HttpResponseRedirect(reverse("admin:django_ragchat_document_change",
                                                        args=[result.document_id]))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "form": form,
            "title": "Upload a document", "media": self.media + form.media,
            "has_view_permission": self.has_view_permission(request),
        }
        return TemplateResponse(request, "admin/django_ragchat/document/upload.html", context)

    def _ingest_in_background(self, request, data) -> bool:
        """Queue a large upload for the task worker, as the documents API does (docs/tasks.md).

        Only when the site runs tasks in a worker and the file is larger than
        ``RAGCHAT["BACKGROUND_INGEST_BYTES"]``; otherwise (the default) it is ingested right away.
        """
        threshold = ragchat_settings.BACKGROUND_INGEST_BYTES
        if data["file"].size <= threshold or not tasks.runs_in_background():
            return False
        tasks.enqueue(tasks.ingest_upload, data["source"], data["text"], data["title"], data["content_type"],
                      data["profile"] or None, data["access"])
        self.message_user(request, f"Queued {data['source']}: it appears here once the task worker "
                                   "has ingested it.", messages.SUCCESS)
        return True

    @admin.action(description="Re-ingest from source (files readable on the server)", permissions=["add"])
    def reingest(self, request, queryset):
        """Ingest again each selected document whose source is a file the server can read.

        Unchanged files are left alone; uploaded documents (``upload/...``) have no file to read
        again: upload them again. A document of a model source is synced from its object.
        """

        readable, unreadable, objects = [], [], {}
        for document in queryset.only("source", "origin", "object_pk"):
            if document.origin:
                objects.setdefault(document.origin, []).append(document.object_pk)
            else:
                (readable if Path(document.source).is_file() else unreadable).append(document.source)
        for origin, pks in objects.items():
            self._sync_objects(request, origin, pks)
        if readable:
            report = ingest_paths(readable)
            by_status: dict[str, int] = {}
            for result in report.results:
                by_status[result.status] = by_status.get(result.status, 0) + 1
                if result.status == "failed":
                    self.message_user(request, f"{result.source}: {result.reason}", messages.ERROR)
            summary = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
            documents = ngettext("%(n)s document", "%(n)s documents", len(readable)) % {"n": f"{len(readable):,}"}
            self.message_user(request, f"Re-ingested {documents}: {summary}.", messages.SUCCESS)
        if unreadable:
            self.message_user(request, "No file to read again for: " + ", ".join(unreadable[:10])
                              + ("…" if len(unreadable) > 10 else "") + " (upload these again).", messages.WARNING)


    def _sync_objects(self, request, origin: str, pks: list[str]) -> None:
        try:
            source = get_source(origin)
        except KeyError:
            self.message_user(request, f"{origin} is no longer a registered model source.", messages.WARNING)
            return
        report = sync(source, pks=pks)
        level = messages.ERROR if report.failures else messages.SUCCESS
        self.message_user(request, "Synced from their objects: " + report.summary(), level)


@admin.register(Chunk)
class ChunkAdmin(ReadOnlyAdmin):
    # No heading or ordinal column: the row's own label says both ("<heading>, part 2").
    list_display = ("__str__", "document_link", "space", "readers", "short_text")
    list_filter = ("space",)
    search_fields = ("text", "heading", "document__title", "document__source")
    fields = ("document_link", "ordinal", "space", "heading", "readers", "chunk_text", "token_count", "metadata")
    readonly_fields = fields

    def get_queryset(self, request):
        return (super().get_queryset(request).filter(access__visible_to=principals_of_user_id(request.user.pk))
                .select_related("document").defer("embedding"))

    @admin.display(description="who may read it")
    def readers(self, obj):
        return readers(obj.access)

    def lookup_allowed(self, lookup, value, request=None):
        if lookup == "document__id__exact":  # the document list's chunk counts link here
            return True
        if request is None:
            return super().lookup_allowed(lookup, value)
        return super().lookup_allowed(lookup, value, request)

    @admin.display(description="document", ordering="document")
    def document_link(self, obj):
        return admin_link(obj.document)

    @admin.display(description="text")
    def short_text(self, obj):
        # Without the heading line the text starts with: the heading has a column of its own.
        return short(admin_views.chunk_snippet(obj))

    @admin.display(description="text")
    def chunk_text(self, obj):
        return format_html('<div class="ragchat-text">{}</div>', obj.text)
