"""Template context of the demo site."""

from django.conf import settings


def demo(request):
    """``demo_extractive``: no model is configured, so answers are quoted from the documents."""
    profile = settings.RAGCHAT["PROFILES"]["default"]
    return {"demo_extractive": profile.get("llm", "extractive") == "extractive"}
