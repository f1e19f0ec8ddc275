from django.contrib import admin

from example_project.orders.models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("number", "owner", "status", "items", "total", "placed_at", "estimated_delivery")
    list_filter = ("status", "carrier")
    search_fields = ("number", "owner__username", "items", "tracking_number")
    raw_id_fields = ("owner",)
    date_hierarchy = "placed_at"
