"""The WSGI application of the gunicorn server tests start: Django, with the app's static
files served as runserver would (the servers run with DEBUG off), for the chat widget's
script and styles in the browser tests."""

import os

from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
application = StaticFilesHandler(get_wsgi_application())
