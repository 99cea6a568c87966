"""The console frame's reads: the signed-in user's Reckon roles, for the nav and the name line (base.html)."""

from typing import Any

from django import template

from tasks.access.permissions import ROLES, roles_of

register = template.Library()


@register.simple_tag(takes_context=True)
def user_roles(context: dict[str, Any]) -> list[str]:
    """The request user's roles in a fixed order; read once per request (cached on the user, shared with the
    access checks), so the frame adds no query to a page that already checked access."""
    request = context.get("request")
    if request is None:
        return []
    held = roles_of(request.user)
    return [role for role in ROLES if role in held]
