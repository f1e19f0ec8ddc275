"""The demo's products: the three product pages of ``example_project/sample_docs`` as ``Product``
rows (their title, their sections as the description, the first price as ``price``), with a few
customer questions and staff-only notes. ``ragchat_sync`` (scripts/demo.sh runs it) indexes them;
the sample documents' policies (``support.md``) stay a file."""

import re
from decimal import Decimal
from pathlib import Path

from django.db import migrations

SAMPLE_DOCS = Path(__file__).resolve().parents[2] / "sample_docs"
PRODUCTS = {
    "aurora-x2.md": ("phones", "Supplier cost $412 a unit; the 512 GB model is discontinued in March.",
                     [("Is a case included?", "No: the Aurora X2 ships without a case; ours cost $29.")]),
    "nimbus-tab.md": ("tablets", "Supplier cost $251 a unit; a 128 GB model is planned for the autumn.",
                      [("Can two pens be paired?", "One Nimbus Pen is paired at a time.")]),
    "zephyr-buds.md": ("audio", "Supplier cost $52 a pair; margins are lowest in this range.", []),
}


def create(apps, schema_editor):
    product_model = apps.get_model("shop", "Product")
    question_model = apps.get_model("shop", "ProductQuestion")
    for filename, (category, notes, questions) in PRODUCTS.items():
        text = (SAMPLE_DOCS / filename).read_text(encoding="utf-8")
        title, _, description = text.partition("\n")
        price = re.search(r"\$(\d[\d,]*)", description)
        product = product_model.objects.create(
            name=title.lstrip("# ").strip(), slug=filename.removesuffix(".md"), category=category,
            price=Decimal(price.group(1).replace(",", "")) if price else Decimal(0),
            description=description.strip(), internal_notes=notes)
        for question, answer in questions:
            question_model.objects.create(product=product, question=question, answer=answer)


def remove(apps, schema_editor):
    apps.get_model("shop", "Product").objects.filter(slug__in=[f.removesuffix(".md") for f in PRODUCTS]).delete()


class Migration(migrations.Migration):

    dependencies = [("shop", "0001_initial")]

    operations = [migrations.RunPython(create, remove)]
