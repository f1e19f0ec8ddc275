"""``manage.py demo_orders <username>``: give a user of the demo a few orders to ask about.

ORD-17 has shipped, ORD-18 is still processing (it can be cancelled), ORD-19 was delivered.
Numbers that exist already (another user's) are left alone: run it for one user.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from example_project.orders.models import Order

ORDERS = (
    ("ORD-17", Order.Status.SHIPPED, "Aurora X2, 128 GB", "699.00", 3, "PostNord", "PN123456SE", 2),
    ("ORD-18", Order.Status.PROCESSING, "Nimbus Tab with stylus", "529.00", 1, "", "", 6),
    ("ORD-19", Order.Status.DELIVERED, "Zephyr Buds", "149.00", 20, "DHL", "DHL-778899", None),
)


class Command(BaseCommand):
    help = "Give a user of the demo a few orders (ORD-17, ORD-18, ORD-19) to ask the assistant about."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        try:
            owner = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user {username!r}; create one first (manage.py createsuperuser).") from None
        now = timezone.now()
        for number, status, items, total, days_ago, carrier, tracking, arrives_in in ORDERS:
            order, created = Order.objects.get_or_create(number=number, defaults={
                "owner": owner, "status": status, "items": items, "total": Decimal(total),
                "placed_at": now - timedelta(days=days_ago), "carrier": carrier, "tracking_number": tracking,
                "estimated_delivery": (now + timedelta(days=arrives_in)).date() if arrives_in else None,
            })
            verb = "created" if created else f"already exists (owner: {order.owner})"
            self.stdout.write(f"{number} {verb}")
