"""The reference agent's PostgreSQL kind: "migrate a table" from one PostgreSQL database to another, driven over the
API (examples/migrate_agent.py ``--postgres-source``/``--postgres-target``) with the client's PostgreSQL connector
(reckon_client.connectors.postgres, ``prefix="pg."``). The server only has to know the actions its plans name: the
connector runs in the agent, which holds the databases' credentials.

The plan: copy the table in batches of key ranges (each a ledger row in the target's own transaction), then switch a
view to the copy (irreversible; its compensation puts the view back). The actions' inputs carry lists (a batch's
``range``), which a node's declared fields cannot describe: they take any object, and the connector refuses a
malformed one as ``invalid_params`` (docs/integrations.md).
"""

KIND = "migrate_table_api"
PG_ACTIONS = {
    "pg.copy_batch": "copy one batch of rows (a key range) into the target table, its op key in the target's ledger",
    "pg.delete_batch": "delete one batch's rows from the target table (compensation of a copy)",
    "pg.switch": "point a view at the copied table, in the ledger row's transaction",
    "pg.switch_back": "put the view back as it was before the switch (compensation of switch)",
}
