"""django-ragchat: conversational retrieval-augmented chat for Django sites.

Plugin authors decorate hook implementations with ``django_ragchat.hookimpl``; the hooks are
documented in ``django_ragchat.hookspecs``.
"""

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("django_ragchat")
