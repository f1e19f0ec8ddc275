"""Search filters: which chunks a retriever may return, applied inside the SQL.

A filter is given as a dict (in a profile's retriever options or per request in
``query.metadata["filters"]``)::

    {
        "metadata": {"product": "aurora", "tags": ["pricing"]},  # JSON containment
        "sources": ["products/aurora-x2.md"],                     # exact document sources, any of
        "source_prefixes": ["products/"],                         # sources starting with any of
    }

Every key is optional and all given keys must hold. ``metadata`` means what PostgreSQL's
``@>`` means on the chunk's ``metadata``: every key given must be present with an equal value;
nested objects match recursively; a list matches a stored list holding every element given.
Values are strings, numbers, booleans, ``None``, objects of those, and lists of scalars. On
SQLite the same containment is compiled to ``json_type``/``json_extract``/``json_each``
conditions, so a filter means the same on both databases.

``SearchFilters`` objects combine with ``&`` (a profile's filter and a request's: both hold).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FILTER_KEYS = ("metadata", "sources", "source_prefixes")
_SCALARS = (str, bool, int, float, type(None))


class InvalidFilters(ValueError):
    """A filter that cannot be applied; the message says what is wrong with it."""


def _check_metadata(value: Any, path: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not key or '"' in key or "\\" in key:
                raise InvalidFilters(f"Filter key {key!r} at {path}: keys must be non-empty strings "
                                     f'without " or \\.')
            _check_metadata(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, _SCALARS):
                raise InvalidFilters(f"Filter list at {path} may hold strings, numbers, booleans "
                                     f"and null only, not {type(item).__name__}.")
            _check_metadata(item, path)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidFilters(f"Filter value at {path} must be a finite number, not {value!r}.")
    elif not isinstance(value, _SCALARS):
        raise InvalidFilters(f"Filter value at {path} has unsupported type {type(value).__name__}.")


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidFilters(f"Filter {key!r} must be a list of strings, not {value!r}.")
    if not all(isinstance(v, str) and v for v in value):
        raise InvalidFilters(f"Filter {key!r} must hold non-empty strings only.")
    return tuple(value)


@dataclass(frozen=True)
class _Clause:
    kind: str  # "metadata", "sources" or "source_prefixes"
    value: Any


@dataclass(frozen=True)
class SearchFilters:
    """Conditions on chunks, all of which must hold. Build with ``SearchFilters.parse``."""

    clauses: tuple[_Clause, ...] = ()

    @classmethod
    def parse(cls, value: Any) -> SearchFilters:
        """Filters from their dict form (see the module docstring); ``None`` means none.

        Raises ``InvalidFilters`` with a message naming the offending key or value.
        """
        if value is None:
            return cls()
        if isinstance(value, SearchFilters):
            return value
        if not isinstance(value, Mapping):
            raise InvalidFilters(f"Filters must be a dict with keys {list(FILTER_KEYS)}, not {value!r}.")
        unknown = sorted(set(value) - set(FILTER_KEYS))
        if unknown:
            raise InvalidFilters(f"Unknown filter key(s) {unknown}; valid keys are {list(FILTER_KEYS)} "
                                 f'(metadata conditions go under "metadata").')
        clauses = []
        metadata = value.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise InvalidFilters(f'Filter "metadata" must be a dict, not {metadata!r}.')
            _check_metadata(metadata, "metadata")
            if metadata:
                clauses.append(_Clause("metadata", json.loads(json.dumps(metadata))))
        for key in ("sources", "source_prefixes"):
            if value.get(key) is not None:
                clauses.append(_Clause(key, _strings(value[key], key)))
        return cls(tuple(clauses))

    def __and__(self, other: SearchFilters) -> SearchFilters:
        return SearchFilters(self.clauses + SearchFilters.parse(other).clauses)

    def __bool__(self) -> bool:
        return bool(self.clauses)

    def sql(self, vendor: str, document_table: str, chunk_alias: str = "c") -> tuple[str, list]:
        """A condition on ``chunk_alias`` (``" AND ..."``, or ``""``) and its parameters."""
        parts: list[str] = []
        params: list = []
        for clause in self.clauses:
            if clause.kind == "metadata":
                if vendor == "postgresql":
                    parts.append(f"{chunk_alias}.metadata @> %s::jsonb")
                    params.append(json.dumps(clause.value))
                else:
                    _sqlite_containment(clause.value, "$", f"{chunk_alias}.metadata", parts, params)
            elif clause.kind == "sources":
                marks = ", ".join(["%s"] * len(clause.value))
                parts.append(f"{chunk_alias}.document_id IN (SELECT fd.id FROM {document_table} fd "
                             f"WHERE fd.source IN ({marks}))")
                params.extend(clause.value)
            else:
                # substr, not LIKE: SQLite's LIKE ignores case and a prefix may hold % or _.
                tests = " OR ".join(["substr(fd.source, 1, %s) = %s"] * len(clause.value))
                parts.append(f"{chunk_alias}.document_id IN (SELECT fd.id FROM {document_table} fd "
                             f"WHERE {tests})")
                for prefix in clause.value:
                    params.extend([len(prefix), prefix])
        return "".join(f" AND {p}" for p in parts), params


def _sqlite_scalar(type_sql: str, value_sql: str, path_params: list, value: Any) -> tuple[str, list]:
    """A condition that a JSON value equals the scalar ``value`` as jsonb equality has it (1
    equals 1.0, true does not equal 1). ``type_sql``/``value_sql`` give the value's json_type and
    SQL value; each holds the placeholders that ``path_params`` fill."""
    if value is None:
        return f"{type_sql} = 'null'", list(path_params)
    if isinstance(value, bool):
        return f"{type_sql} = '{'true' if value else 'false'}'", list(path_params)
    types = "= 'text'" if isinstance(value, str) else "IN ('integer', 'real')"
    return f"({type_sql} {types} AND {value_sql} = %s)", [*path_params, *path_params, value]


def _sqlite_containment(value: dict, path: str, column: str, parts: list[str], params: list) -> None:
    for key, item in value.items():
        item_path = f'{path}."{key}"'
        if isinstance(item, dict):
            parts.append(f"json_type({column}, %s) = 'object'")
            params.append(item_path)
            _sqlite_containment(item, item_path, column, parts, params)
        elif isinstance(item, list):
            parts.append(f"json_type({column}, %s) = 'array'")
            params.append(item_path)
            for element in item:
                test, test_params = _sqlite_scalar("je.type", "je.value", [], element)
                parts.append(f"EXISTS (SELECT 1 FROM json_each({column}, %s) je WHERE {test})")
                params.extend([item_path, *test_params])
        else:
            test, test_params = _sqlite_scalar(f"json_type({column}, %s)", f"json_extract({column}, %s)",
                                               [item_path], item)
            parts.append(test)
            params.extend(test_params)
