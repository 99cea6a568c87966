"""Log in, log out, change the password: Django's auth views with the console's templates and messages. The
console's own login, not the Django admin's (which refuses non-staff)."""

from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.http import HttpRequest, HttpResponse
from django.urls import path


class LoginView(auth_views.LoginView):
    template_name = "console/auth/login.html"
    redirect_authenticated_user = True

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)
        messages.success(self.request, f"Signed in as {form.get_user().get_username()}.")
        return response


class LogoutView(auth_views.LogoutView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().post(request, *args, **kwargs)
        messages.info(request, "You are logged out.")
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "console/auth/password_change.html"

    def form_valid(self, form: PasswordChangeForm) -> HttpResponse:
        response = super().form_valid(form)
        messages.success(self.request, "Your password was changed; you stay signed in.")
        return response


urlpatterns = [
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", LogoutView.as_view(), name="logout"),
    path("password/", PasswordChangeView.as_view(), name="password_change"),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="console/auth/password_change_done.html"),
        name="password_change_done",
    ),
]
