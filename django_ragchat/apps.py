from django.apps import AppConfig


class RagchatConfig(AppConfig):
    name = "django_ragchat"
    verbose_name = "RAG chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        # checks: imported to register the system checks.
        from django_ragchat import checks  # noqa: F401
        from django_ragchat.transport import sessions
        from django_ragchat.turn import shutdown

        user_logged_in.connect(sessions.move_anonymous_conversations, dispatch_uid="ragchat_move_anonymous")
        # Chained to the server's handlers: saves the answers being written on SIGTERM (see
        # shutdown.py; turns on the main thread install it again if the server replaced it).
        shutdown.install()
