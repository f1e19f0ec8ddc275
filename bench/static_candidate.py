"""A benchmark-only embedder for comparing another static model that ships inside a package with
the default one (bench/README.md, "The semantic default"): ``static_candidate`` loads a
Model2Vec-format folder (``tokenizer.json``, ``model.safetensors`` with ``embeddings`` and,
when quantised, ``mapping`` and ``weights``) named by ``RAGCHAT_BENCH_STATIC_MODEL``.

    RAGCHAT_BENCH_STATIC_MODEL=/path/to/static_model/model \\
        .venv/bin/python bench/bench_canard.py --plugins bench.static_candidate --embedders static_candidate
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from django_ragchat import hookimpl
from django_ragchat.backends.static import StaticModel, read_safetensors


@lru_cache(maxsize=1)
def candidate_model() -> StaticModel:
    folder = Path(os.environ["RAGCHAT_BENCH_STATIC_MODEL"])
    tensors = read_safetensors(folder / "model.safetensors")
    return StaticModel.from_files(folder / "tokenizer.json", folder / "model.safetensors", name=f"static:{folder}",
                                  tensor="embeddings" if "embeddings" in tensors else "embedding.weight",
                                  mapping="mapping" if "mapping" in tensors else None,
                                  token_weights="weights" if "weights" in tensors else None)


@hookimpl
def register_embedders(register):
    from django_ragchat.stages.embedders import Embedder  # noqa: PLC0415 - needs configured settings

    class CandidateEmbedder(Embedder):
        name = "static_candidate"
        local_semantic = True

        def __init__(self, profile, **options):
            super().__init__(profile, **options)
            self.model = candidate_model()
            self.dimension = self.model.dimension

        @property
        def space(self) -> str:
            return f"candidate-{self.dimension}"

        def embed(self, texts):
            return self.model.embed(texts)

    register(CandidateEmbedder)
