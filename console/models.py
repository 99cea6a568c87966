"""The console's own rows (not the domain's): a person's saved queue views."""

from django.conf import settings
from django.db import models


class SavedView(models.Model):
    """A named filter set of one queue, for its owner only: the screen's url name and the filter's query string."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=80)
    screen = models.CharField(max_length=20)
    query = models.CharField(max_length=2000, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="saved_view_name_unique_per_owner"),
            models.CheckConstraint(
                condition=models.Q(screen__in=["task-list", "attention"]), name="saved_view_screen_valid"
            ),
        ]
        # The unique constraint's index serves the page's list of the owner's views.

    def __str__(self) -> str:
        return f"saved view {self.name!r} of user {self.owner_id}"
