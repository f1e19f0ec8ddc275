"""Clients of the servers a site's models run on: ``openai`` (any OpenAI-compatible server).

The components that use them live in ``stages`` (the ``openai`` LLM backend and embedder, the
model-backed query transformers and summary memory); a backend holds connections, requests,
streaming and error mapping, and knows nothing of turns.
"""
