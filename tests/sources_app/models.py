"""A small knowledge base: articles with tags and notes, each readable by everyone, its owner,
a group, staff or holders of a permission."""

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models


class Tag(models.Model):
    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


class Article(models.Model):
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    published = models.BooleanField(default=True)
    # Who may read it (any mix): nobody set means everyone.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL)
    staff_only = models.BooleanField(default=False)
    permission = models.CharField(max_length=100, blank=True, help_text="app_label.codename")
    tags = models.ManyToManyField(Tag, blank=True, related_name="articles")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return self.title

    def get_absolute_url(self) -> str:
        return f"/articles/{self.pk}/"


class Note(models.Model):
    """Part of its article's text (``depends_on``)."""

    article = models.ForeignKey(Article, on_delete=models.CASCADE, related_name="notes")
    text = models.TextField()


class Page(models.Model):
    """Indexed through a template (``template_name``)."""

    heading = models.CharField(max_length=200)
    content = models.TextField()
