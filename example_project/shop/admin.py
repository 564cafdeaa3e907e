from django.contrib import admin

from .models import Order, Report


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer_email", "total_cents", "confirmed_at", "published_at")


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "orders_seen", "created_at")
