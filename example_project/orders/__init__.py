"""The demo shop's orders: an ``Order`` model and the assistant's tools over it (``ragchat.py``).

A small, normal Django app: it shows how a site lets the assistant look things up in its own
data, as the asking user and only within that user's rights (docs/tools.md).
"""
