"""Plugins with mistakes, for the system-check tests."""

from django_ragchat import hookimpl


class Misspelt:
    @hookimpl
    def register_retreivers(self, register):  # sic: "retreivers"
        pass


class NotAComponent:
    @hookimpl
    def register_retrievers(self, register):
        register(dict)


misspelt = Misspelt()
not_a_component = NotAComponent()
