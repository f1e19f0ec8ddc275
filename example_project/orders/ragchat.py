"""The assistant's tools over the shop's orders (a django-ragchat plugin: docs/tools.md).

Each tool runs as the user who asked (``turn.user``) and sees only that user's orders: an
order of someone else answers exactly as an order that does not exist, so numbers cannot be
probed. Visitors who are not signed in are never offered them (``permission``).
"""

from __future__ import annotations

from django_ragchat import hookimpl
from django_ragchat.tools import ToolError, tool
from example_project.orders.models import Order


def signed_in(turn) -> bool:
    return turn.user.is_authenticated


def _order(turn, order_number: str) -> Order:
    number = order_number.strip().upper()
    order = Order.objects.filter(owner=turn.user, number=number).first()
    if order is None:
        raise ToolError(f"There is no order {number} on this customer's account.")
    return order


@tool(permission=signed_in, label="Looking up order {order_number}…")
def order_status(turn, order_number: str) -> dict:
    """The status of one of the signed-in customer's orders: what was ordered, whether it has
    shipped, the carrier and tracking number, and when it should arrive.

    Args:
        order_number: The order's number as printed on the receipt, such as ORD-17.
    """
    order = _order(turn, order_number)
    return {
        "number": order.number,
        "status": order.status,
        "items": order.items,
        "total": str(order.total),
        "placed_at": order.placed_at.date().isoformat(),
        "carrier": order.carrier or None,
        "tracking_number": order.tracking_number or None,
        "estimated_delivery": order.estimated_delivery.isoformat() if order.estimated_delivery else None,
    }


@tool(permission=signed_in, requires_confirmation=True, label="Cancelling order {order_number}…")
def cancel_order(turn, order_number: str) -> dict:
    """Cancel one of the signed-in customer's orders that has not shipped yet. The customer
    confirms before it happens.

    Args:
        order_number: The order's number as printed on the receipt, such as ORD-17.
    """
    order = _order(turn, order_number)
    if order.status != Order.Status.PROCESSING:
        raise ToolError(f"Order {order.number} is {order.status} and can no longer be cancelled.")
    Order.objects.filter(pk=order.pk, status=Order.Status.PROCESSING).update(status=Order.Status.CANCELLED)
    return {"number": order.number, "status": Order.Status.CANCELLED}


@hookimpl
def register_tools(register):
    register(order_status)
    register(cancel_order)
