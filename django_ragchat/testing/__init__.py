"""Test helpers for django-ragchat and its plugins (no Django needed to import).

* :mod:`django_ragchat.testing.openai_server`: ``FakeOpenAIServer``, an
  OpenAI-compatible HTTP server with scripted replies and fault injection.
* :mod:`django_ragchat.testing.pytest_plugin`: the ``openai_server`` fixtures.
"""
