"""An OpenAI-compatible endpoint: existing OpenAI clients and chat UIs talk to a site's assistant.

``GET models`` lists the profiles the caller may use (a profile is a model), ``POST
chat/completions`` runs one turn of the site's pipeline (retrieval, memory, guardrails, the
profile's model) and answers in OpenAI's shapes, whole or streamed. Callers authenticate with an
API key (``ApiKey``) or their session. Mount ``django_ragchat.openai_api.urls``; see
docs/openai-endpoint.md.

Modules: ``auth`` (who calls), ``parsing`` (the request as a turn), ``completions`` (the answer
in OpenAI's shapes), ``naming`` (the title of a conversation it starts), ``errors`` (OpenAI's
error object), ``views``, ``urls``.
"""
