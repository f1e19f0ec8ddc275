"""The pipeline's components, one module per kind, each with its base class and built-ins.

In the order a turn runs them: ``guardrails``, ``memory`` (and ``summary_memory``),
``transformers`` (and ``llm_transformers``), ``expanders``, ``retrievers``, ``joiners``,
``postprocessors``, ``prompts``, ``llms``, ``responses`` (with the answer builder, ``answers``);
``embedders`` serve retrieval and ingestion. A plugin subclasses the base class of its stage
from that module (docs/plugins.md lists them) and registers it through the stage's hook; the
built-ins register through the same hooks.
"""
