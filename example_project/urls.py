from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/ragchat/", include("django_ragchat.api.urls")),
    # The OpenAI-compatible endpoint: base_url "http://<site>/openai/v1" (docs/openai-endpoint.md).
    path("openai/v1/", include("django_ragchat.openai_api.urls")),
    # The chat widget inside a page of the site ({% ragchat_widget %}, docs/widget.md).
    path("embed/", TemplateView.as_view(template_name="example/embed.html"), name="embed"),
    path("", include("django_ragchat.urls")),
]
