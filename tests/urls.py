from django.contrib import admin
from django.urls import path

from alkstore_django.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("alkstore/metrics", metrics_view),
]
