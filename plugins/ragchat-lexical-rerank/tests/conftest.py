"""Fixtures for the plugin's tests (run from the django-ragchat checkout with its
``tests.settings``; the project's own ``tests/conftest.py`` does not apply here)."""

import pytest

from django_ragchat import plugins
from django_ragchat.search.vectorindex import vector_index


@pytest.fixture(autouse=True)
def _fresh_ragchat_state():
    """Each test builds plugins and components from its own settings, and searches vectors
    freshly loaded from its own rows (rolled-back tests may reuse chunk ids)."""
    plugins.reset()
    vector_index.clear()
    yield
    plugins.reset()
    vector_index.clear()
