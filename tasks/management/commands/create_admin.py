from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.errors import Refused
from tasks.access.accounts import admin_bootstrap


class Command(BaseCommand):
    help = (
        "Make the first Reckon admin: creates the account with a generated password (printed once) and grants it the "
        "admin role, audited as the system principal create_admin. A Django superuser is not a Reckon admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--existing", action="store_true", help="make an existing account admin (password kept)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user, password = admin_bootstrap(username=options["username"], existing=options["existing"])
        except Refused as error:
            raise CommandError(str(error)) from error
        self.stdout.write(f"{user.get_username()} is a Reckon admin.")
        if password is not None:
            self.stdout.write(f"password: {password}")
            self.stdout.write("It is shown only now: log in and change it (Password, top right).")
