from django.contrib import admin

from example_project.shop.models import Product, ProductQuestion


class QuestionInline(admin.TabularInline):
    model = ProductQuestion
    extra = 1


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("name", "category", "price", "published", "updated_at")
    list_filter = ("published", "category")
    search_fields = ("name", "description")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [QuestionInline]
