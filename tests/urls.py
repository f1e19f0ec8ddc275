from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/ragchat/", include("django_ragchat.api.urls")),
    # The OpenAI-compatible endpoint: base_url "http://<site>/openai/v1" (docs/openai-endpoint.md).
    path("openai/v1/", include("django_ragchat.openai_api.urls")),
    path("chat/", include("django_ragchat.urls")),
    # Real sign-in and sign-out views (tests/test_sessions.py).
    path("accounts/", include("django.contrib.auth.urls")),
]

# A page of a site with the chat widget on it (tests/test_browser.py).
_EMBED = """{% load ragchat %}<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Products</title>
<meta http-equiv="Content-Security-Policy" content="script-src 'self'; object-src 'none'; base-uri 'none'"></head>
<body><h1>Our products</h1><p>Questions? Ask below.</p>{% ragchat_widget label="Product questions" %}</body></html>"""


_EMBED_TWO = """{% load ragchat %}<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Two</title></head>
<body><div id="first">{% ragchat_widget label="First" %}</div><div id="second">{% ragchat_widget label="Second" compact=True %}</div>
</body></html>"""


# A widget with a profile of its own (tests/test_browser.py): its conversations are "shouting"'s.
_EMBED_PROFILE = """{% load ragchat %}<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Loud</title></head>
<body>{% ragchat_widget label="Loud questions" profile="shouting" %}</body></html>"""


# A desk page of a site whose widget books with tools needing approval (tests/test_browser_tools.py):
# a conversation started here is opened again on the chat page.
_EMBED_TOOLS = """{% load ragchat %}<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Desk</title></head>
<body><h1>Your orders</h1>{% ragchat_widget label="Order questions" profile="fake_tools" %}</body></html>"""


def _render(source):
    def view(request):
        from django.http import HttpResponse
        from django.template import engines

        return HttpResponse(engines["django"].from_string(source).render({}, request))
    return view


urlpatterns += [path("embed/", _render(_EMBED)), path("embed-two/", _render(_EMBED_TWO)),
                path("embed-profile/", _render(_EMBED_PROFILE)), path("embed-tools/", _render(_EMBED_TOOLS))]
