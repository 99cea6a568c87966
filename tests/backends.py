"""Which tests CI runs on which backend (.ci/run runs the suite twice, side by side on two cores: once on the
embedded default, SQLite with the filesystem broker, once scaled out, PostgreSQL with Redis).

A test runs once, in the SQLite pass, unless it is named here: that is the default, so a new test runs once until
someone names it. Named tests are of two kinds:

- ``BOTH_PASSES`` (marker ``backend``): the database or the broker can change what the test sees — the write path's
  own SQL (compare-and-set, leases, one statement per change on PostgreSQL), what the database itself enforces
  (constraints, append-only triggers, what a superuser gets past), queries pinned in number or built per backend,
  threads or processes sharing one database, and what goes through the broker. They run in both passes.
- ``POSTGRES_PASS_ONLY`` (marker ``once_postgres``): tests that need PostgreSQL (skipped on SQLite: real races,
  partitions through the fault proxy, the production topology, the API fuzzing on a live server), and
  backend-independent ones placed in the PostgreSQL pass to balance the two passes' times. A test marked
  ``postgres`` is one of them without being named.

Run by hand, every test runs on whichever database DATABASE_URL names: the markers only choose CI's passes
(.ci/run: the SQLite pass ``-m "not once_postgres"``, the PostgreSQL pass ``-m "(backend or once_postgres) and not
browser and not demo"``). ``python -m tests.backends`` checks that the two passes together run every test, each
named test exists, and prints the counts (docs/testing.md).

Each entry is a file under tests/ (``test_cas.py``, ``browser/test_flows.py``) or one test of it
(``test_plans.py::test_plan_accept_refuses_a_running_task``, every parametrization included).
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Group:
    why: str
    tests: tuple[str, ...]


def _in(file: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{file}::{name}" for name in names)


BOTH_PASSES: tuple[Group, ...] = (
    Group(
        "The write path's own SQL: compare-and-set, leases and the step protocol write through raw statements with a "
        "branch per backend (one statement that commits alone on PostgreSQL, row locks, the database server's "
        "clock); every test whose subject is a write through it, a refusal of one, or random sequences of them.",
        (
            "test_cas.py",
            "test_leases.py",
            "test_lease_state.py",
            "test_protocol.py",
            "test_final_not_found.py",
            "test_smoke_protocol.py",
            "test_shared_commit.py",
            "test_api_one_step.py",
            "test_snapshot_reuse.py",
            "test_permits.py",
            "test_takeover.py",
            "test_takeover_smoke.py",
            "test_approvals.py",
            "test_approval_binding.py",
            "test_event_log.py",
            "test_recovery.py",
            "test_stateful_leases.py",
            "test_stateful_protocol.py",
            "test_api_scope.py",
            "test_api_refusals_declared.py",
            "test_budget.py",
            *_in(
                "test_plans.py",
                "test_task_create_stores_plan_revision_1_proposed_by_the_creator_and_accepted",
                "test_task_create_creates_the_nodes_of_plan_version_1_in_dependency_order",
                "test_task_create_records_task_created_then_plan_accepted",
                "test_task_create_collects_the_input_refs_of_every_node",
                "test_plan_propose_stores_a_proposal_and_changes_no_node",
                "test_plan_propose_refuses_an_invalid_plan_and_writes_nothing",
                "test_plan_propose_refuses_a_stale_version_and_writes_nothing",
                "test_plan_propose_refuses_an_expired_lease_and_writes_nothing",
                "test_plan_accept_makes_the_proposal_the_tasks_plan",
                "test_plan_accept_returns_a_paused_task_to_pending",
                "test_plan_accept_refuses_a_running_task",
                "test_plan_accept_refuses_a_completed_task",
                "test_plan_accept_refuses_while_an_operation_is_open",
                "test_plan_accept_refuses_a_revision_already_accepted",
                "test_plan_accept_refuses_a_stale_version_and_writes_nothing",
                "test_plan_accept_refuses_a_proposal_older_than_the_current_plan",
                "test_a_replan_keeps_an_identical_succeeded_node_and_does_not_redo_its_effect",
                "test_a_replan_resets_a_succeeded_node_whose_definition_changed",
                "test_a_replan_resets_a_failed_node_even_when_unchanged",
                "test_a_replan_does_not_keep_a_node_whose_input_comes_from_a_node_that_is_redone",
                "test_a_person_proposes_and_accepts_as_themselves_and_hands_the_task_back",
                "test_a_person_may_not_propose_without_holding_the_task",
                "test_an_auditor_may_not_propose_or_accept",
                "test_a_stale_person_replan_is_refused_with_the_changes_since",
                "test_the_agent_path_keeps_its_lease_checks",
            ),
            *_in(
                "test_bulk.py",
                "test_a_refusal_after_the_claim_rolls_back_everything_written_for_that_task",
            ),
            *_in("test_permissions.py", "test_the_last_admin_cannot_revoke_their_own_admin_role"),
            *_in("test_retention.py", "test_each_retain_of_a_name_is_its_next_version"),
        ),
    ),
    Group(
        "What the database itself enforces, and what someone with DDL rights gets past: check and unique "
        "constraints, the append-only and capture triggers (installed per backend), the audit head's row lock, "
        "tampering as a superuser (session_replication_role on PostgreSQL, dropped triggers on SQLite), raw SQL.",
        (
            "test_constraints.py",
            "test_append_only.py",
            "test_event_archive.py",
            "test_audit_hygiene.py",
            "test_log_integrity.py",
            "test_audit.py",
            "test_account_changes.py",
            "test_anchoring.py",
            "test_anchor_verdict.py",
            "test_console_verify_anchors.py",
            *_in(
                "test_hygiene.py",
                "test_verify_log_finds_and_quarantines_a_secret_in_a_well_chained_event",
                "test_verify_log_quarantines_an_event_a_secret_was_written_into_with_raw_sql",
                "test_verify_log_names_the_secret_even_when_the_injection_broke_the_chain",
            ),
            *_in("test_console_admin.py", "test_verify_now_reports_a_tampered_audit_chain"),
            # The webhook URL's CHECK constraint: LIKE is case-insensitive on SQLite only (issue 25's 500).
            *_in(
                "test_webhook_targets.py",
                "test_the_database_refuses_a_scheme_not_in_lower_case_on_both_backends",
                "test_an_upper_case_scheme_is_case_folded_before_the_check_constraint",
                "test_the_api_answers_a_named_422_and_writes_nothing",
            ),
            *_in("test_api_tokens.py", "test_issuing_stores_only_the_hash_and_writes_one_audit_row"),
        ),
    ),
    Group(
        "Queries pinned in number or whose SQL differs per backend: the step budget (statements, BEGIN and COMMIT "
        "counted), pages that cost a fixed number of queries, keyset pages over rows sharing one instant (timestamp "
        "precision), JSON lookups (JsonArrayHas per backend), case-insensitive text filters, the database clock.",
        (
            "test_step_budget.py",
            "test_queries.py",
            "test_detail_reads.py",
            "test_console_list.py",
            "test_consequences.py",
            "test_takeover_pause_shown.py",
            *_in(
                "test_api_foundation.py",
                "test_reading_a_task_costs_the_same_with_3_or_30_nodes",
                "test_listing_tasks_costs_the_same_with_3_or_30_tasks",
            ),
            *_in("test_api_tokens.py", "test_the_page_costs_the_same_with_3_or_30_tokens"),
            *_in(
                "test_console_admin.py",
                "test_the_roles_page_costs_the_same_for_3_accounts_as_for_30",
                "test_the_review_queue_costs_the_same_for_3_releases_as_for_30",
                "test_the_audit_log_costs_the_same_for_3_rows_as_for_30",
                "test_the_audit_log_pages_newest_first_by_keyset",
            ),
            *_in("test_console_auth.py", "test_access_reads_the_roles_once_per_request"),
            *_in("test_console_bulk.py", "test_the_bulk_pages_read_the_same_number_of_queries_for_3_and_30_tasks"),
            *_in("test_console_cancel.py", "test_the_confirmation_and_the_status_cost_the_same_for_1_row_as_for_15"),
            *_in(
                "test_console_detail.py",
                "test_the_page_costs_the_same_for_3_nodes_as_for_30",
                "test_the_page_costs_the_same_for_10_events_as_for_100",
                "test_on_the_database_clock_the_page_reads_the_clock_once_more",
                "test_a_page_with_the_takeover_package_costs_the_same_for_3_nodes_as_for_30",
                "test_a_long_log_is_not_verified_on_open_and_costs_fewer_queries",
                "test_expires_in_follows_the_database_clock",
                "test_the_timeline_pages_never_repeat_or_skip",
            ),
            *_in("test_console_force_release.py", "test_the_form_costs_the_same_queries_for_1_operation_as_for_12"),
            *_in(
                "test_console_queue.py",
                "test_the_text_filter_looks_in_title_kind_and_project",
                "test_attention_pages_skip_nothing_while_tasks_join_and_leave_the_queue",
            ),
            *_in(
                "test_console_reconcile.py",
                "test_the_actions_page_costs_the_same_queries_for_1_row_as_for_12",
                "test_the_settle_and_reset_dialogs_cost_a_fixed_number_of_queries",
            ),
            *_in(
                "test_console_takeover.py",
                "test_the_page_costs_the_same_queries_for_3_nodes_as_for_30",
                "test_the_lease_panel_and_the_replan_page_cost_a_fixed_number_of_queries",
            ),
            *_in(
                "test_notes.py",
                "test_the_note_count_is_part_of_the_one_query_of_a_page",
                "test_the_notes_page_reads_a_fixed_number_of_queries",
            ),
            *_in("test_permissions.py", "test_roles_are_read_once_per_user_object"),
            *_in(
                "test_remote_down_shown.py",
                "test_the_work_queue_row_says_it_with_the_page_read_not_a_query_per_row",
                "test_the_api_task_carries_remote_down_while_the_remote_stays_down_and_null_otherwise",
                "test_reading_it_is_one_query_by_primary_key_and_none_for_an_ended_task_or_a_page_read_with_it",
            ),
            *_in("test_metrics.py", "test_without_the_token_the_scrape_is_refused_and_reads_nothing"),
            *_in("test_console_retained.py", "test_the_page_reads_a_fixed_number_of_queries"),
            *_in(
                "test_lease_state.py",
                "test_the_queries_select_a_lease_exactly_when_the_function_says_so",
                "test_the_queries_select_no_closed_lease",
            ),
            *_in(
                "test_webhooks.py",
                "test_an_event_nobody_maps_costs_no_query_and_a_mapped_one_with_no_subscriber_costs_one",
            ),
        ),
    ),
    Group(
        "Several connections, transactions or processes on one database, and what goes through the broker (Redis "
        "in the PostgreSQL pass, the filesystem broker in the SQLite one): racing beats and webhook senders, a "
        "change's outbox and its commit, skip-locked sweeps, real Celery workers and beats, readiness of the "
        "database and the broker, the recovery scan's claims and messages, a trace carried through a message.",
        (
            "test_beat_lease.py",
            "test_worker.py",
            "test_health.py",
            "test_liveness.py",
            *_in("test_bulk.py", "test_a_real_worker_applies_a_run_enqueued_on_commit"),
            *_in(
                "test_webhooks.py",
                "test_the_outbox_row_is_written_in_the_changes_transaction_and_sent_only_after_commit",
                "test_a_worker_process_delivers_after_commit_retries_a_failure_and_the_sweep_sends_a_lost_one",
                "test_workers_racing_for_one_delivery_send_it_once",
            ),
            *_in(
                "test_retention.py",
                "test_a_purge_removes_the_file_and_keeps_the_row_as_the_record",
                "test_sweeping_twice_gives_the_same_result",
                "test_a_sweep_that_crashed_half_way_is_finished_by_the_next",
                "test_a_sweep_that_cannot_remove_a_file_leaves_it_purging_and_the_next_retries",
                "test_the_sweep_never_touches_another_tasks_objects",
                "test_the_sweep_never_touches_receipts_or_attachment_files",
                "test_a_purged_objects_file_that_reappears_is_removed",
                "test_the_sweep_works_in_batches",
                "test_an_explicit_now_decides_what_is_due",
                "test_the_job_and_the_command_run_the_sweep",
            ),
            *_in("test_reference_agent.py", "test_two_scans_that_saw_the_same_version_run_one_wake_up"),
            *_in(
                "test_tracing.py",
                "test_a_console_request_a_real_worker_and_its_connector_calls_are_one_trace_with_versions_and_op_keys",
            ),
            # The reduced kill matrix: each pass runs its own scenarios (RECKON_MATRIX_SCENARIOS in .ci/run), those
            # about many workers and true concurrency on PostgreSQL + Redis.
            *_in("test_kill_matrix.py", "test_every_scenario_of_the_kill_matrix_ends_clean"),
        ),
    ),
)

POSTGRES_PASS_ONLY: tuple[Group, ...] = (
    Group(
        "Need PostgreSQL (skipped on SQLite) without the postgres marker: a worker partitioned from its database "
        "through the fault proxy, psycopg through the proxy.",
        (
            *_in("test_partitions.py", "test_every_partition_scenario_ends_clean", "test_the_failover_row_ends_clean"),
            *_in(
                "test_fault_proxy.py",
                "test_postgres_blackholed_query_hangs_and_is_answered_once_healed",
                "test_postgres_blackholed_connect_times_out_on_the_client",
                "test_postgres_cut_is_an_operational_error_and_heal_lets_a_new_connection_work",
            ),
        ),
    ),
    Group(
        "Backend-independent, in the PostgreSQL pass to even the two passes' times (the SQLite pass also runs "
        "ruff, mypy, the browser tests, the demo and the model check): the reference agent's processes over HTTP as "
        "a deployment runs them (the API itself is tested on both); the log format, checked in fresh processes; the "
        "web server's process model (gunicorn's workers, SIGTERM); docs/api.md's curl walkthrough, on the same "
        "gunicorn as the reference agent's. (The settings' refusals at start-up, test_secure_defaults.py, went back "
        "to the SQLite pass once the PostgreSQL pass became the longer one.)",
        (
            "test_agent_e2e.py",
            "test_reference_agent_postgres.py",
            "test_api_walkthrough.py",
            "test_logging.py",
            "test_production_server.py",
        ),
    ),
)


def _entries(groups: tuple[Group, ...]) -> frozenset[str]:
    return frozenset(entry for group in groups for entry in group.tests)


BOTH = _entries(BOTH_PASSES)
POSTGRES_ONLY = _entries(POSTGRES_PASS_ONLY)


def _check_entries() -> None:
    """A name that matches no test would quietly drop that test from the PostgreSQL pass: every entry must name
    a file under tests/ and a function (or Class::method) defined in it."""
    problems = []
    for entry in sorted(BOTH | POSTGRES_ONLY):
        file, _, name = entry.partition("::")
        path = TESTS / file
        if not path.is_file():
            problems.append(f"{entry}: no file tests/{file}")
        elif name and not re.search(rf"^\s*(async )?def {re.escape(name.split('::')[-1])}\(", path.read_text(), re.M):
            problems.append(f"{entry}: no test {name} in tests/{file}")
    for entry in sorted(BOTH & POSTGRES_ONLY):
        problems.append(f"{entry}: named in both BOTH_PASSES and POSTGRES_PASS_ONLY")
    if problems:
        raise pytest.UsageError("tests/backends.py:\n  " + "\n  ".join(problems))


def mark(items: list[pytest.Item]) -> None:
    """pytest_collection_modifyitems (tests/conftest.py): the ``backend`` and ``once_postgres`` markers."""
    _check_entries()
    for item in items:
        file = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else item.path.name
        cls = getattr(item, "cls", None)
        name = getattr(item, "originalname", item.name)
        names = {file, f"{file}::{name}"} | ({f"{file}::{cls.__name__}::{name}"} if cls else set())
        if names & BOTH:
            item.add_marker(pytest.mark.backend)
        if names & POSTGRES_ONLY or item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.once_postgres)


# --------------------------------------------------------------------------------------- python -m tests.backends


def _passes() -> dict[str, str]:
    """The two passes' -m expressions, read from .ci/run itself."""
    text = (TESTS.parent / ".ci" / "run").read_text()
    found = re.findall(r'\./dev test (?:[^"\n]*? )?-m "([^"]+)"', text)
    if len(found) != 2:
        raise SystemExit(f".ci/run: expected two './dev test -m \"…\"' passes, found {found}")
    postgres, sqlite = found  # .ci/run starts the PostgreSQL pass first, in the background
    return {"sqlite": sqlite, "postgres": postgres}


def _collect(*args: str) -> set[str]:
    run = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=TESTS.parent,
        env=os.environ | {"RECKON_ENV": os.environ.get("RECKON_ENV", "test")},
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode not in (0, 5):
        raise SystemExit(run.stdout[-3000:] + run.stderr[-3000:])
    return {line for line in run.stdout.splitlines() if "::" in line}


def main() -> None:
    everything = _collect()
    selected = {name: _collect("-m", expression) for name, expression in _passes().items()}
    sqlite, postgres = selected["sqlite"], selected["postgres"]
    for name, expression in _passes().items():
        print(f"{name} pass (-m {expression!r}): {len(selected[name])} tests")
    print(
        f"both passes: {len(sqlite & postgres)}; SQLite only: {len(sqlite - postgres)}; "
        f"PostgreSQL only: {len(postgres - sqlite)}"
    )
    print(f"union: {len(sqlite | postgres)} of {len(everything)} collected")
    missing = sorted(everything - (sqlite | postgres))
    if missing:
        raise SystemExit("run by neither pass:\n  " + "\n  ".join(missing))


if __name__ == "__main__":
    main()
