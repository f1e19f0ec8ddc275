"""The turn runtime: one user message in, one saved assistant message out.

``pipeline`` runs the stages in order (``stream_turn``, ``run_turn``, ``run_turn_sync``);
``context`` is what every stage receives (``TurnContext``, the profile's components);
``advisors`` the around-advice chains; ``persistence`` a turn's reads and writes (leases,
heartbeats); ``limits`` the per-user limits; ``lanes`` the database threads; ``shutdown`` what
SIGTERM does; ``sync_bridge`` iterating the async turn from synchronous code. Stages never
import from here (tests/test_code_shape.py).
"""
