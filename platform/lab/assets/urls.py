from django.urls import path

from lab.assets import views

app_name = "assets"
urlpatterns = [
    path("", views.asset_list, name="list"),
]
