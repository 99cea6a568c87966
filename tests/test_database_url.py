"""DATABASE_URL with PostgreSQL's multi-host form (console/database_url.py): a primary and its standbys in one URL,
every host handed to libpq; anything else read as dj-database-url reads it."""

import dj_database_url
import pytest

from console.database_url import MultiHostInvalid, parse_database_url

FAILOVER = "postgres://reckon:s3cret@db1.internal:5432,db2.internal:6432/reckon?target_session_attrs=read-write"


def test_every_host_of_a_multi_host_url_reaches_libpq_with_the_session_it_asks_for() -> None:
    config = parse_database_url(FAILOVER, conn_max_age=600)
    assert (config["HOST"], config["PORT"]) == ("db1.internal,db2.internal", "5432,6432")
    assert (config["NAME"], config["USER"], config["PASSWORD"]) == ("reckon", "reckon", "s3cret")
    assert config["OPTIONS"] == {"target_session_attrs": "read-write"}
    assert config["ENGINE"] == "django.db.backends.postgresql" and config["CONN_MAX_AGE"] == 600


def test_a_host_without_a_port_takes_postgresqls() -> None:
    config = parse_database_url("postgresql://u@a,b:5433/db")
    assert (config["HOST"], config["PORT"]) == ("a,b", "5432,5433")


@pytest.mark.parametrize(
    "url",
    ["postgres://u@127.0.0.1:5432/reckon", "sqlite:////tmp/reckon.sqlite3", "postgres://u@[::1]:5432/reckon"],
)
def test_a_single_host_url_is_read_as_dj_database_url_reads_it(url: str) -> None:
    assert parse_database_url(url) == dj_database_url.parse(url)


@pytest.mark.parametrize(
    ("url", "said"),
    [("postgres://u@a:5432,:5433/db", "an empty host"), ("postgres://u@a:5432,b:x1/db", "port 'x1' of host 'b'")],
)
def test_a_multi_host_url_that_names_no_host_or_a_bad_port_is_refused_by_name(url: str, said: str) -> None:
    with pytest.raises(MultiHostInvalid, match=said):
        parse_database_url(url)
