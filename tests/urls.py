from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/ragchat/", include("django_ragchat.api.urls")),
    path("chat/", include("django_ragchat.urls")),
    # Real sign-in and sign-out views (tests/test_sessions.py).
    path("accounts/", include("django.contrib.auth.urls")),
]
