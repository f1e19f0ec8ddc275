"""Template tags of django-ragchat.

``{% load ragchat %}{% ragchat_widget %}`` puts the chat widget on any page of a site: the
conversation list, a new conversation, the streamed answer with its sources, feedback. Its
stylesheet and ES module (``static/django_ragchat/widget.css``, ``widget.js``) come with it;
no build step. See docs/widget.md.
"""

from __future__ import annotations

import secrets
from urllib.parse import quote

from django import template
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.shortcuts import resolve_url

from django_ragchat.transport.views import may_chat, page_config  # views import the API's URLs

register = template.Library()

#: The message box's placeholder when the tag is given none.
PLACEHOLDER = "Ask a question about the documents…"


@register.inclusion_tag("django_ragchat/widget.html", takes_context=True)
def ragchat_widget(context, label: str = "Chat", compact: bool = False, notice: str = "", profile: str = "",
                   model_notice: str = "", placeholder: str = PLACEHOLDER):
    """The chat widget.

    ``label`` names it for screen readers (``aria-label``); ``compact`` hides the conversation
    list behind a button at every width (as it is on a phone), for a widget in a side panel;
    ``notice`` is a line of text shown above the messages (the demo says its answers are
    extractive until a model is configured); ``profile`` (a name in ``RAGCHAT["PROFILES"]``)
    starts its conversations with that profile and lists only those (the default profile's
    widget lists them all); a name that is no profile raises ``UnknownProfile``. ``model_notice``
    is a line shown above the messages only while the conversation shown (or the one a message
    would start) has a profile with no language model (the extractive answerer): the chat page
    says its answers are quoted until a model is configured. ``placeholder`` is the hint in the
    empty message box (escaped, as every text the tag is given; ``""``: none).
    Needs ``django.template.context_processors.request``. A visitor who may not chat (anonymous,
    with ``RAGCHAT["ALLOW_ANONYMOUS"]`` off) sees a link to ``settings.LOGIN_URL`` instead.
    """

    request = context.get("request")
    if request is None:
        raise ImproperlyConfigured(
            "{% ragchat_widget %} needs the request in the template context: add "
            '"django.template.context_processors.request" to your TEMPLATES context_processors.'
        )
    widget_id = "ragchat-" + secrets.token_hex(4)  # several widgets on a page stay apart
    if not may_chat(request):
        login = resolve_url(settings.LOGIN_URL)
        return {"widget_id": widget_id, "label": label, "compact": compact, "notice": notice,
                "login_url": f"{login}?next={quote(request.get_full_path())}"}
    config = page_config(request, profile)
    extractive = {name for name, shown in config["profiles"].items() if shown["extractive"]}
    return {"widget_id": widget_id, "config_id": widget_id + "-config", "label": label, "compact": compact,
            "notice": notice, "placeholder": placeholder, "model_notice": model_notice if extractive else "",
            "model_notice_shown": config["defaultProfile"] in extractive, "config": config}
