"""WSGI entry point of the demo site: the page, the REST API and server-sent events (no
websockets; the page falls back to server-sent events by itself).

    gunicorn example_project.wsgi --worker-class gthread --threads 8

A thread per open stream: use a threaded worker class, not gunicorn's default sync workers.
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_wsgi_application()
