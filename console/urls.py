from django.contrib import admin
from django.urls import path

from console import views

urlpatterns = [
    path("", views.task_list, name="task-list"),
    path("admin/", admin.site.urls),
]
