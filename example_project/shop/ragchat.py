"""The shop's products as knowledge (docs/sources.md). Listed in ``RAGCHAT["PLUGINS"]``.

* ``products``: every published product, with its questions and answers, readable by everyone.
  Saving a product or one of its questions re-indexes it; unpublishing it removes it.
* ``product_notes``: the staff-only field of each product, readable by staff alone. A field
  only some users may read is a source of its own over the same model: an ordinary user's
  question never retrieves it, so no answer can quote it.
"""

from django_ragchat import hookimpl
from django_ragchat.sources import PUBLIC, STAFF, ModelSource
from example_project.shop.models import Product, ProductQuestion


class ProductSource(ModelSource):
    name = "products"
    model = Product
    updated_field = "updated_at"
    depends_on = {ProductQuestion: "product"}

    def get_queryset(self):
        return Product.objects.filter(published=True).prefetch_related("questions")

    def text(self, obj):
        questions = "".join(f"\n\n**{q.question}** {q.answer}" for q in obj.questions.all())
        # "Customer questions": a decline lists the headings the passages are about, and
        # "about pricing, warranty and questions" said nothing of these.
        return obj.description + (f"\n\n## Customer questions{questions}" if questions else "")

    def metadata(self, obj):
        return {"category": obj.category, "price": float(obj.price)}

    def access(self, obj):
        return PUBLIC


class ProductNotesSource(ModelSource):
    name = "product_notes"
    model = Product
    updated_field = "updated_at"

    def get_queryset(self):
        return Product.objects.exclude(internal_notes="")

    def title(self, obj):
        return f"{obj.name} (staff notes)"

    def text(self, obj):
        return f"## Internal notes\n\n{obj.internal_notes}"

    def access(self, obj):
        return STAFF


@hookimpl
def register_sources(register):
    register(ProductSource)
    register(ProductNotesSource)
