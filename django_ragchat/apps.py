from django.apps import AppConfig


class RagchatConfig(AppConfig):
    name = "django_ragchat"
    verbose_name = "RAG chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: these modules import the app's models, which Django
        # loads only after every app's config (the ready() idiom of Django's own apps).
        from django.contrib.auth.signals import user_logged_in, user_logged_out  # noqa: PLC0415

        from django_ragchat import checks, tasks  # noqa: F401, PLC0415  (checks registers the system checks)
        from django_ragchat.sources import live  # noqa: PLC0415
        from django_ragchat.transport import sessions  # noqa: PLC0415
        from django_ragchat.turn import shutdown  # noqa: PLC0415

        user_logged_in.connect(sessions.move_anonymous_conversations, dispatch_uid="ragchat_move_anonymous")
        # Model sources' live sync: every model's saves and deletes, looked up in the registry.
        live.connect()
        # Without the tasks framework's lines for each of the app's tasks the immediate backend
        # runs on the spot (two per saved object of a model source, with DEBUG on): tasks.py.
        tasks.quiet_on_the_spot_task_logs()
        user_logged_out.connect(sessions.close_session_sockets, dispatch_uid="ragchat_close_session_sockets")
        # Chained to the server's handlers: saves the answers being written on SIGTERM (see
        # shutdown.py; turns on the main thread install it again if the server replaced it).
        shutdown.install()
