"""``manage.py ragchat_plugins``: what is loaded, and in which order it runs.

Lists every plugin (built-in, from ``RAGCHAT["PLUGINS"]`` or from an entry point) with the
hooks it implements, each hook's implementations in call order, every registered component by
pipeline stage in call order (its ``order`` value, then registration index), for each
profile the components it runs, and the model sources (``register_sources``) with the model
each indexes. ``--json`` prints the same as one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

from django.core.management.base import BaseCommand

from django_ragchat.plugins import (
    PIPELINE_ORDER,
    STAGE_KINDS,
    get_registry,
    hook_implementations,
    plugin_listing,
    plugin_origin,
    profile_listing,
    registered_sources,
    tool_listing,
)
from django_ragchat.sources import registry as source_registry


def describe() -> dict:
    """Everything the command prints, as JSON-ready data."""
    registry = get_registry()
    kinds = [STAGE_KINDS[f] for f in PIPELINE_ORDER]
    kinds += [k for k in registry.kinds() if k not in kinds]
    components = {
        kind: [
            {"name": r.name, "order": r.order, "index": r.index, "plugin": r.plugin,
             "class": f"{r.cls.__module__}.{r.cls.__qualname__}", "enabled_by_default": r.cls.enabled_by_default}
            for r in registry.all() if r.kind == kind  # all() is in call order within a stage
        ]
        for kind in kinds
    }
    return {
        "plugins": [{**p, "origin": plugin_origin(p["name"]).kind} for p in plugin_listing()],
        "hooks": hook_implementations(),
        "components": components,
        "tools": tool_listing(),
        "profiles": profile_listing(),
        "sources": _sources(),
        "errors": list(registry.errors) + [message for _, message, _ in source_registry.problems()],
    }


def _sources() -> list[dict]:
    """Each valid model source: its name, model, class, the plugin that registered it, how it
    is kept in sync and the models it follows."""
    plugin_of = {cls: plugin for cls, plugin in registered_sources()}
    watching = source_registry.current().watching
    return [
        {"name": name, "model": source.get_model()._meta.label, "plugin": plugin_of.get(type(source), ""),
         "class": f"{type(source).__module__}.{type(source).__qualname__}", "live": source.live,
         "updated_field": source.updated_field,
         "follows": sorted(m._meta.label for m, pairs in watching.items()
                           if any(s is source and f.kind != "self" for s, f in pairs))}
        for name, source in source_registry.sources().items()
    ]


class Command(BaseCommand):
    help = "List plugins, hook implementations and components in call order, and what each profile runs."
    # It diagnoses plugin problems, so it runs when the checks report them (and prints them last).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def execute(self, *args, **options):
        try:
            output = super().execute(*args, **options)
            self.stdout.flush()  # inside the try: a pipe closed early fails here, not at exit
            return output
        except BrokenPipeError:
            # "ragchat_plugins | head": the reader has what it wanted. End as Python's docs advise
            # (https://docs.python.org/3/library/signal.html#note-on-sigpipe), not with a traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None

    def handle(self, *args, **options):
        data = describe()
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        write = self.stdout.write
        write("Plugins, in load order:")
        for plugin in data["plugins"]:
            version = f" {plugin['version']}" if plugin["version"] else ""
            write(f"  {plugin['name']}{version} ({plugin['origin']}): {', '.join(plugin['hooks']) or 'no hooks'}")
        write("")
        write("Hook implementations, in call order:")
        for hook, plugins in data["hooks"].items():
            write(f"  {hook}: {', '.join(plugins)}")
        write("")
        write("Components by stage, in call order (order value, registration index):")
        for kind, components in data["components"].items():
            write(f"  {kind}:")
            for c in components:
                default = "" if c["enabled_by_default"] else ", off by default"
                write(f"    {c['name']}  order={c['order']} index={c['index']}  from {c['plugin']} "
                      f"({c['class']}{default})")
            if not components:
                write("    (none)")
        self._write_tools(data["tools"])
        write("")
        write("Profiles:")
        for name, runs in data["profiles"].items():
            title = runs.pop("title")
            write(f"  {name}:" if title == name else f"  {name} ({title}):")
            if "error" in runs:
                write(self.style.ERROR(f"    {runs['error']}"))
                continue
            for field, names in runs.items():
                write(f"    {field}: {', '.join(names) or '-'}")
        self._write_sources(data["sources"])
        for error in data["errors"]:
            self.stderr.write(self.style.ERROR(error))

    def _write_tools(self, tools: list[dict]) -> None:
        write = self.stdout.write
        write("")
        write("Tools (register_tools), by name:")
        for t in tools:
            confirm = ", asks the user first" if t["requires_confirmation"] else ""
            write(f"  {t['name']}  from {t['plugin']} ({t['label']}{confirm})")
        if not tools:
            write("  (none)")

    def _write_sources(self, found: list[dict]) -> None:
        write = self.stdout.write
        write("")
        write("Model sources (register_sources):")
        for source in found:
            how = "live" if source["live"] else "ragchat_sync only"
            follows = f"; follows {', '.join(source['follows'])}" if source["follows"] else ""
            write(f"  {source['name']}: {source['model']} ({how}{follows}) from {source['plugin']} ({source['class']})")
        if not found:
            write("  (none)")
