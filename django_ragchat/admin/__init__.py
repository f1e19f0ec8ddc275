"""Admin: staff read conversations with their turn traces, correct memory, and manage documents.

* Conversations list their owner, profile, first question, size, last activity and feedback;
  a conversation's page shows its transcript as a conversation, each answer with its trace
  (collapsed) rendered for people, paginated past ``admin.views.TRANSCRIPT_PAGE_SIZE`` messages.
* The message log is append-only: messages, sources, traces and feedback are read-only here
  (no Save button, no bulk delete); they go with their conversation or with "erase a user's
  chat data".
* Memory records (summaries and facts the model is shown) are editable, which is the point of them.
* Documents are added by uploading a file, which runs ingestion; chunks are never added by hand.
* API keys (the OpenAI-compatible endpoint's) are created for a user, shown once, and revoked.
* "User chat data" (a link on the conversation list, an action on the user admin) exports one
  user's chat data as JSON and erases it after a page counting what will go.

Every list runs a fixed number of queries whatever its page size (tests/test_admin.py asserts it).
All text shown comes from users, models or documents and is escaped (``format_html``, templates).
See docs/admin.md.

Laid out by what staff work on: ``conversations`` (and a user's chat data), ``message_log``
(messages, sources, traces, feedback), ``memory``, ``documents``, ``api_keys``; ``base`` holds what they share
and ``views`` the pages beyond Django's defaults.
"""

# Importing the modules registers their ModelAdmins with the default admin site.
from django_ragchat.admin import api_keys, conversations, documents, memory, message_log, sources  # noqa: F401
