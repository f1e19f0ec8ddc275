"""The demo's shop: products (and their questions) as Django models, which the assistant answers
from through model sources (``ragchat.py``; docs/sources.md)."""
