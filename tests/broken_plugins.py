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


class TwoMisspelt:
    @hookimpl
    def register_guardrials(self, register):  # sic
        pass

    @hookimpl
    def on_turn_complete(self, turn, message):  # sic: on_turn_completed
        pass


misspelt = Misspelt()
two_misspelt = TwoMisspelt()
not_a_component = NotAComponent()
