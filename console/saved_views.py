"""Saved queue views: the only writes the queue pages make. A view belongs to its owner; nobody else reads,
opens or deletes it (another person's view is "not found", not "forbidden": its existence is not disclosed)."""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404

from console.models import SavedView
from leases import clock

SCREENS = ("task-list", "attention")
# request.user as the views hold it; an anonymous visitor (no pk) owns nothing and cannot save.
type Owner = AbstractBaseUser | AnonymousUser
MAX_VIEWS_PER_OWNER = 50


class TooManySavedViews(ValueError):
    pass


def saved_views_of(owner: Owner) -> QuerySet[SavedView]:
    return SavedView.objects.filter(owner_id=owner.pk).order_by("name")


def saved_view_of(owner: Owner, view_id: int) -> SavedView:
    """``owner``'s view ``view_id``; Http404 for anyone else's or none."""
    view = SavedView.objects.filter(owner_id=owner.pk, pk=view_id).first()
    if view is None:
        raise Http404("No such saved view.")
    return view


def saved_view_save(*, owner: Owner, name: str, screen: str, query: str) -> SavedView:
    """Save ``query`` (a filter query string) for ``screen`` under ``name``; the same name again replaces it."""
    if owner.pk is None:
        raise ValueError("only a logged-in person saves views")
    if screen not in SCREENS:
        raise ValueError(f"no queue named {screen!r}")
    with transaction.atomic():
        if not SavedView.objects.filter(owner_id=owner.pk, name=name).exists() and (
            SavedView.objects.filter(owner_id=owner.pk).count() >= MAX_VIEWS_PER_OWNER
        ):
            raise TooManySavedViews(f"You have {MAX_VIEWS_PER_OWNER} saved views: delete one first.")
        view, _ = SavedView.objects.update_or_create(
            owner_id=owner.pk,
            name=name,
            defaults={"screen": screen, "query": query},
            create_defaults={"screen": screen, "query": query, "created_at": clock.now()},
        )
    return view


def saved_view_delete(*, owner: Owner, view_id: int) -> None:
    """Delete ``owner``'s view ``view_id``; Http404 for anyone else's (nothing is deleted)."""
    deleted, _ = SavedView.objects.filter(owner_id=owner.pk, pk=view_id).delete()
    if deleted == 0:
        raise Http404("No such saved view.")
