"""A customer's orders, as a shop keeps them."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Order(models.Model):
    class Status(models.TextChoices):
        PROCESSING = "processing", "processing"
        SHIPPED = "shipped", "shipped"
        DELIVERED = "delivered", "delivered"
        CANCELLED = "cancelled", "cancelled"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="orders")
    # The number printed on the receipt ("ORD-17").
    number = models.CharField(max_length=32, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PROCESSING)
    items = models.CharField(max_length=300, help_text="What was ordered, as the receipt says it.")
    total = models.DecimalField(max_digits=10, decimal_places=2)
    placed_at = models.DateTimeField()
    carrier = models.CharField(max_length=60, blank=True, default="")
    tracking_number = models.CharField(max_length=60, blank=True, default="")
    estimated_delivery = models.DateField(null=True, blank=True)

    class Meta:
        ordering = ["-placed_at"]

    def __str__(self) -> str:
        return self.number
