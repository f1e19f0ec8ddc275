"""Models of the model-source tests (``tests/sources_plugin.py`` declares their sources)."""
