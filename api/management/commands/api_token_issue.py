"""./dev manage api_token_issue — issue an agent token from the command line, as an admin (audited as that admin,
exactly as the console's Agent tokens page does it). The plaintext is printed once, on stdout, alone on its line."""

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from api.tokens import TokenError, api_token_issue
from audit.errors import Refused
from audit.principals import Principal


class Command(BaseCommand):
    help = "Issue an agent API token, scoped to task kinds and/or projects, as the named admin (audited)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin", required=True, help="the username of the admin issuing it")
        parser.add_argument("--agent", required=True, help="the agent id the token names (agent:<id> in the record)")
        parser.add_argument("--kind", action="append", default=[], help="a task kind in its scope (repeatable)")
        parser.add_argument("--project", action="append", default=[], help="a project in its scope (repeatable)")
        parser.add_argument("--name", default="", help="what the token is for (shown on the Agent tokens page)")

    def handle(self, *args: Any, **options: Any) -> None:
        admin = User.objects.filter(username=options["admin"], is_active=True).first()
        if admin is None:
            raise CommandError(f"no active user {options['admin']!r}")
        try:
            row, plaintext = api_token_issue(
                actor=Principal.of_user(admin),
                agent_id=options["agent"],
                kinds=options["kind"],
                projects=options["project"],
                name=options["name"],
            )
        except (TokenError, Refused) as error:
            raise CommandError(str(error)) from error
        self.stderr.write(f"token {row.pk} for agent {row.agent_id} (kinds {row.kinds}, projects {row.projects}):")
        self.stdout.write(plaintext)
