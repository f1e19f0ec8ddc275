from django.apps import AppConfig


class RagchatConfig(AppConfig):
    name = "django_ragchat"
    verbose_name = "RAG chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_ragchat import checks  # noqa: F401  (registers the system checks)
