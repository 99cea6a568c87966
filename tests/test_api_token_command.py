"""``manage.py api_token_issue``: the console's Agent tokens page on the command line — admins only, audited, the
plaintext printed once and stored only as its hash."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from api.models import ApiToken
from api.tokens import api_token_authenticate, token_hash
from audit.models import AuditEvent
from tests.conftest import person, snapshot

pytestmark = pytest.mark.django_db


def test_an_admin_issues_a_token_that_works_and_is_audited() -> None:
    person("root", "admin")
    out, err = StringIO(), StringIO()
    call_command(
        "api_token_issue", admin="root", agent="migrator", kind=["migrate_project_api"], stdout=out, stderr=err
    )
    plaintext = out.getvalue().strip()
    row = api_token_authenticate(plaintext)
    assert row is not None and row.agent_id == "migrator" and row.kinds == ["migrate_project_api"]
    assert ApiToken.objects.get().token_hash == token_hash(plaintext) and plaintext not in err.getvalue()
    audit = AuditEvent.objects.get(action="api_token_issued")
    assert (audit.actor_kind, audit.actor_id) == ("user", "root")


@pytest.mark.parametrize(
    ("who", "options", "says"),
    [
        ("olga", {"kind": ["k"]}, "admin"),  # an operator is no admin
        ("nobody", {"kind": ["k"]}, "no active user"),
        ("root", {}, "at least one task kind or project"),
    ],
)
def test_a_refused_issue_writes_nothing(who: str, options: dict[str, list[str]], says: str) -> None:
    person("root", "admin")
    person("olga", "operator")
    before = snapshot()
    with pytest.raises(CommandError, match=says):
        call_command("api_token_issue", admin=who, agent="a", stdout=StringIO(), stderr=StringIO(), **options)
    assert snapshot() == before
