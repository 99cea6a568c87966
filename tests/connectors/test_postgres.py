"""What is the PostgreSQL connector's own: the effect and its ledger row commit together, digests computed at the
target, the view switch and its undo, a lookup that never answers "not found" while a write is open, the table's
version, and names that cannot carry SQL."""

from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql
from reckon_client import Fenced, NotFound
from reckon_client.connectors.postgres import rows_digest

from tests.connectors.checks import committed, failed, in_thread, submit_against_fence, wait_until
from tests.connectors.remotes import BATCH, BATCH_ROWS, PgRemote, new_target_table, op_key, pg_query

ROW = "ROW(id, name, price, at, tags, payload, blob)::text"
CANONICAL = (
    "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 1; "
    "SET bytea_output = 'hex'"
)


def texts(conninfo: str, query: Any, params: tuple[Any, ...] = ()) -> list[str]:
    """Row texts as the connector's sessions print them."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(CANONICAL)
        return [str(text) for (text,) in conn.execute(query, params).fetchall()]


def ledger_rows(pg: PgRemote, key: str) -> list[tuple[Any, ...]]:
    return pg_query(pg.databases.target, "SELECT state, remote_id FROM reckon_ledger WHERE op_key = %s", (key,))


def waiting_on_a_lock(pg: PgRemote) -> list[tuple[Any, ...]]:
    return pg_query(
        pg.databases.target,
        "SELECT pid, query FROM pg_stat_activity WHERE application_name = 'reckon-connector' "
        "AND wait_event_type = 'Lock' AND datname = current_database()",
    )


def copied(pg: PgRemote) -> tuple[str, dict[str, Any]]:
    """A target table holding a committed batch, and the request that copied it."""
    request = pg.write()
    committed(pg.connector().submit(op_key(), request))
    return request["input"]["target"], request


def reads(pg: PgRemote, view: str) -> int:
    (count,) = pg_query(pg.databases.target, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(view)))[0]
    return int(count)


def test_a_write_killed_before_its_commit_leaves_neither_its_rows_nor_its_ledger_row(pg: PgRemote) -> None:
    connector, request, key = pg.connector(), pg.write(), op_key()
    assert connector.fence(op_key()) == Fenced()  # the ledger exists
    with psycopg.connect(pg.databases.target) as blocker:
        # Held by another transaction, the ledger's lock stops the write at its last statement, its rows already in.
        blocker.execute("LOCK TABLE reckon_ledger IN EXCLUSIVE MODE")
        thread, answer = in_thread(lambda: connector.submit(key, request))
        wait_until(lambda: bool(waiting_on_a_lock(pg)))
        [(pid, query)] = waiting_on_a_lock(pg)
        assert query.startswith('INSERT INTO "reckon_ledger"'), query
        pg_query(pg.databases.target, "SELECT pg_terminate_backend(%s)", (pid,))
        blocker.rollback()
    thread.join(30)
    failed(answer[0], "dependency_unavailable")  # no COMMIT was sent: nothing took effect
    assert pg.effects(request) == 0
    assert ledger_rows(pg, key) == []
    assert connector.lookup(key) == NotFound()
    committed(connector.submit(key, request))
    assert pg.effects(request) == 1
    assert ledger_rows(pg, key) == [("committed", f"{request['input']['target']}[id 101..150]")]


def test_a_lookup_never_answers_not_found_while_a_write_of_its_key_is_open(pg: PgRemote) -> None:
    writer, asker = pg.connector(), pg.connector(lock_timeout=0.3)
    request, key = pg.write(), op_key()
    assert writer.fence(op_key()) == Fenced()
    with psycopg.connect(pg.databases.target) as blocker:
        blocker.execute("LOCK TABLE reckon_ledger IN EXCLUSIVE MODE")
        thread, answer = in_thread(lambda: writer.submit(key, request))
        wait_until(lambda: bool(waiting_on_a_lock(pg)))
        failed(asker.lookup(key), "connection_interrupted")  # unknown, not "not found": the write may still commit
        failed(asker.fence(key), "connection_interrupted")
        blocker.rollback()
    thread.join(30)
    receipt = committed(answer[0])
    assert asker.lookup(key) == receipt
    assert pg.effects(request) == 1


def test_the_receipts_digest_is_computed_at_the_target_and_is_the_source_rows_digest(pg: PgRemote) -> None:
    request, key = pg.write(), op_key()
    receipt = committed(pg.connector().submit(key, request))
    where = f"FROM {{}} WHERE id BETWEEN {BATCH[0]} AND {BATCH[1]}"
    source = texts(pg.databases.source, sql.SQL(f"SELECT {ROW} " + where).format(sql.Identifier("items")))
    target_name = sql.Identifier(*request["input"]["target"].split("."))
    target = texts(pg.databases.target, sql.SQL(f"SELECT {ROW} " + where).format(target_name))
    assert len(source) == BATCH_ROWS and any('""quoted"", (comma) ü' in text for text in source)
    assert sorted(target) == sorted(source)
    assert (receipt.count, receipt.digest) == (BATCH_ROWS, "sha256:" + rows_digest(source))


def test_a_target_that_does_not_read_back_as_the_source_writes_nothing(pg: PgRemote) -> None:
    table = f"narrow_{uuid4().hex[:8]}"
    # Its price keeps one decimal: the copy would round 126.25 to 126.3 and still "succeed".
    columns = "id int, name text, price numeric(10, 1), at timestamptz, tags text[], payload jsonb, blob bytea"
    pg_query(pg.databases.target, sql.SQL("CREATE TABLE {} (" + columns + ")").format(sql.Identifier(table)))
    request = pg.write()
    request["input"]["target"] = table
    key = op_key()
    outcome = failed(pg.connector().submit(key, request), "invalid_params")
    assert "do not read back as the source's" in outcome.detail
    assert pg_query(pg.databases.target, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))) == [(0,)]
    assert ledger_rows(pg, key) == []


def test_a_target_already_holding_a_row_of_the_batch_is_a_conflict(pg: PgRemote) -> None:
    request, key = pg.write(), op_key()
    target = sql.Identifier(*request["input"]["target"].split("."))
    pg_query(pg.databases.target, sql.SQL("INSERT INTO {} (id, name) VALUES (120, 'someone else')").format(target))
    failed(pg.connector().submit(key, request), "conflict")
    assert pg_query(pg.databases.target, sql.SQL("SELECT count(*) FROM {}").format(target)) == [(1,)]
    assert ledger_rows(pg, key) == []


def test_a_source_that_moved_from_the_version_named_is_a_conflict(pg: PgRemote) -> None:
    connector = pg.connector()
    version = connector.current_version("public.items")
    pg.change_source()
    request = pg.write()
    request["input"]["source_version"] = version
    failed(connector.submit(op_key(), request), "conflict")
    assert pg.effects(request) == 0
    request["input"]["source_version"] = connector.current_version("public.items")
    committed(connector.submit(op_key(), request))
    assert pg.effects(request) == 1


def test_the_switch_moves_the_view_with_its_ledger_row_and_switch_back_restores_it(pg: PgRemote) -> None:
    connector = pg.connector()
    first, _ = copied(pg)
    second, _ = copied(pg)
    pg_query(pg.databases.target, sql.SQL("DELETE FROM {} WHERE id > 140").format(sql.Identifier(*second.split("."))))
    view = f"current_{uuid4().hex[:8]}"

    switch = {"action": "switch", "input": {"view": view, "table": first}}
    assert committed(connector.submit(op_key(), switch)).remote_version == first
    assert reads(pg, view) == BATCH_ROWS

    key = op_key()
    to_second = {"action": "switch", "input": {"view": view, "table": second}}
    receipt = committed(connector.submit(key, to_second))
    assert (receipt.remote_id, receipt.remote_version) == (f"public.{view}", second)
    assert reads(pg, view) == 40
    assert connector.submit(key, to_second) == receipt  # replayed from the ledger, not switched again
    assert ledger_rows(pg, key) == [("committed", f"public.{view}")]

    back = {"action": "switch_back", "input": {"view": view, "table": second}}
    undone = committed(connector.compensate(op_key(), back))
    assert undone.remote_version == first
    assert reads(pg, view) == BATCH_ROWS
    failed(connector.compensate(op_key(), back), "conflict")  # the view no longer reads the second table


def test_a_fenced_switch_never_moves_the_view(pg: PgRemote) -> None:
    connector, key = pg.connector(), op_key()
    first, _ = copied(pg)
    second, _ = copied(pg)
    view = f"current_{uuid4().hex[:8]}"
    committed(connector.submit(op_key(), {"action": "switch", "input": {"view": view, "table": first}}))
    assert connector.fence(key) == Fenced()
    assert connector.submit(key, {"action": "switch", "input": {"view": view, "table": second}}) == Fenced()
    [(reads_now,)] = pg_query(pg.databases.target, "SELECT definition FROM pg_views WHERE viewname = %s", (view,))
    assert first.split(".")[1] in reads_now and second.split(".")[1] not in reads_now


def test_the_switch_back_of_a_view_that_did_not_exist_drops_it(pg: PgRemote) -> None:
    connector = pg.connector()
    table, _ = copied(pg)
    view = f"current_{uuid4().hex[:8]}"
    committed(connector.submit(op_key(), {"action": "switch", "input": {"view": view, "table": table}}))
    committed(connector.compensate(op_key(), {"action": "switch_back", "input": {"view": view, "table": table}}))
    assert pg_query(pg.databases.target, "SELECT to_regclass(%s)", (view,)) == [(None,)]


def test_delete_batch_removes_exactly_the_batch_once(pg: PgRemote) -> None:
    connector, key = pg.connector(), op_key()
    _, request = copied(pg)
    undo = {"action": "delete_batch", "input": request["input"]}
    receipt = committed(connector.compensate(key, undo))
    assert receipt.count == BATCH_ROWS
    assert connector.compensate(key, undo) == receipt
    assert pg.effects(request) == 0


def test_delete_drops_one_table_once_per_op_key(pg: PgRemote) -> None:
    connector, key = pg.connector(), op_key()
    staging = f"public.{new_target_table(pg.databases)}"
    receipt = committed(connector.delete(key, staging))
    assert (receipt.remote_id, receipt.count) == (staging, 1)
    assert connector.delete(key, staging) == receipt
    assert pg_query(pg.databases.target, "SELECT to_regclass(%s)", (staging,)) == [(None,)]
    assert committed(connector.delete(op_key(), staging)).count == 0
    failed(connector.delete(op_key(), "staging; DROP TABLE reckon_ledger"), "invalid_params")


def test_the_table_version_is_the_digest_of_its_rows_and_moves_only_with_their_values(pg: PgRemote) -> None:
    connector = pg.connector()
    version = connector.current_version("public.items")
    rows = texts(pg.databases.source, "SELECT t::text FROM items AS t")
    assert version == f"rows:{len(rows)}:sha256:{rows_digest(rows)}"

    pg_query(pg.databases.source, "UPDATE items SET price = price + 0, name = name WHERE id <= 100")  # same values
    pg_query(pg.databases.source, "VACUUM FULL items")  # rows in another physical order
    assert connector.current_version("public.items") == version
    pg_query(pg.databases.source, "UPDATE items SET price = price + 0.01 WHERE id = 400")
    assert connector.current_version("public.items") not in (version,)
    pg_query(pg.databases.source, "UPDATE items SET price = price - 0.01 WHERE id = 400")
    assert connector.current_version("public.items") == version
    pg_query(pg.databases.source, "INSERT INTO items (id, name) VALUES (100000, 'new')")
    inserted = connector.current_version("public.items")
    assert inserted.startswith(f"rows:{len(rows) + 1}:") and inserted != version
    pg_query(pg.databases.source, "DELETE FROM items WHERE id = 100000")
    assert connector.current_version("public.items") == version


def test_names_cannot_carry_sql_and_nothing_changes(pg: PgRemote) -> None:
    connector = pg.connector()
    before = connector.current_version("public.items")
    good = pg.write()["input"]
    for name in ("items; DROP TABLE items", "items --", '"items"', "public.items.id", "a b", "", "x" * 64):
        for field in ("source", "target"):
            failed(
                connector.submit(op_key(), {"action": "copy_batch", "input": good | {field: name}}), "invalid_params"
            )
        failed(
            connector.submit(op_key(), {"action": "switch", "input": {"view": name, "table": "items"}}),
            "invalid_params",
        )
    failed(
        connector.submit(op_key(), {"action": "copy_batch", "input": good | {"key": "id) OR (1=1"}}), "invalid_params"
    )
    assert connector.current_version("public.items") == before


def test_a_fence_and_a_submit_racing_for_one_op_key_never_both_win(pg: PgRemote) -> None:
    for _ in range(5):
        request, key = pg.write(), op_key()
        writer, fencer = pg.connector(), pg.connector()
        submitted, fenced = submit_against_fence(writer, fencer, key, request)
        if submitted == Fenced():
            assert fenced == Fenced() and pg.effects(request) == 0
        else:
            assert fenced == committed(submitted) and pg.effects(request) == 1


def test_a_batch_named_by_its_keys_copies_exactly_those_rows(pg: PgRemote) -> None:
    request = pg.write()
    request["input"] = {k: v for k, v in request["input"].items() if k != "range"} | {"keys": [3, 7, 400, 9999]}
    receipt = committed(pg.connector().submit(op_key(), request))
    assert receipt.count == 3 and receipt.remote_id.endswith("[id in 4 keys]")
    target = sql.Identifier(*request["input"]["target"].split("."))
    assert pg_query(pg.databases.target, sql.SQL("SELECT id FROM {} ORDER BY id").format(target)) == [
        (3,),
        (7,),
        (400,),
    ]


def test_a_batch_larger_than_max_rows_is_refused_before_anything_is_read_whole(pg: PgRemote) -> None:
    request = pg.write()
    failed(pg.connector(max_rows=49).submit(op_key(), request), "invalid_params")
    assert pg.effects(request) == 0
    committed(pg.connector(max_rows=50).submit(op_key(), request))
