"""The shop's catalogue: products, and the questions customers asked about them."""

from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(unique=True)
    category = models.CharField(max_length=100, blank=True)
    price = models.DecimalField(max_digits=10, decimal_places=2, help_text="The base price, in dollars.")
    description = models.TextField(help_text="Markdown; its ## headings become the sections the assistant cites.")
    published = models.BooleanField(default=True, help_text="Only published products are answered about.")
    internal_notes = models.TextField(blank=True, help_text="Staff only: supplier, margin, plans. Ordinary "
                                                            "users never get answers from it.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ProductQuestion(models.Model):
    """A question about a product and the shop's answer (part of the product's text)."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="questions")
    question = models.CharField(max_length=300)
    answer = models.TextField()

    class Meta:
        ordering = ["product", "pk"]

    def __str__(self) -> str:
        return self.question
