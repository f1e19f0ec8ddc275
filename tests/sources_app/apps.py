from django.apps import AppConfig


class SourcesAppConfig(AppConfig):
    name = "tests.sources_app"
    label = "sources_app"
    default_auto_field = "django.db.models.BigAutoField"
