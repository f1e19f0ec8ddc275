"""Template tags of the app's own admin pages (``{% load ragchat_admin %}``)."""

from __future__ import annotations

import django
from django import template
from django.urls import reverse

register = template.Library()

#: Django 6.0 writes the admin's breadcrumbs as a list (``<ol class="breadcrumbs">``, styled
#: per item); before, as links in a ``<div>``. A page of our own must match its Django's.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 0)


@register.inclusion_tag("django_ragchat/admin/breadcrumbs.html", takes_context=True)
def ragchat_breadcrumbs(context, *trail):
    """Home › the app › ``trail``: labels and URLs alternating, then the current page's label
    ("Documents", url, "Upload"), written as the running Django writes its own."""
    opts = context["opts"]
    links = [("Home", reverse("admin:index")),
             (opts.app_config.verbose_name, reverse("admin:app_list", kwargs={"app_label": opts.app_label}))]
    *pairs, current = trail
    links += list(zip(pairs[::2], pairs[1::2], strict=True))
    return {"links": links, "current": current, "as_list": BREADCRUMBS_AS_LIST}
