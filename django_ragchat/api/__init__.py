"""The REST API of django-ragchat (Django REST framework, with a drf-spectacular schema).

Mount it with ``path("api/ragchat/", include("django_ragchat.api.urls"))``; docs/api.md
describes the endpoints and who may call them.
"""
