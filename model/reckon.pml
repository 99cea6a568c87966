/*
 * Reckon's step / lease protocol as a Promela model, checked exhaustively by spin (model/check.py runs it).
 *
 * What it is: the database (one task row, its nodes, operations and lease row, the reservation, the abstract
 * database clock) as global variables; every database write is one `atomic` block, the way the real code makes
 * it one transaction. Processes: W agents (workers), one operator (a person: cancel and takeover), one admin
 * (forced release), the remote (a deduplicating store with a tombstone per op key; a request may still be in
 * flight after its caller gave up, and land later — or arrive after its deadline and be refused), and the database
 * clock. Every action names in a comment the function it mirrors (file:function); tests/test_model_check.py checks
 * that those names still exist.
 *
 * Abstractions: the snapshot and the decision are read in one atomic step and the compare-and-set checks the
 * version, so a change computed on a snapshot is applied only to the same state (every state change moves the
 * version, a reservation with its takeover_requested event); the decision is therefore evaluated on the globals
 * inside the compare-and-set — except the deadline, which is read on the snapshot taken before the lookup (`fin`).
 * The database clock is abstract: a lease is live, expired (in its grace) or lapsed, an open operation's deadline
 * (not_after + the skew allowance: one step, since the skew bounds how far the remote's clock is from the
 * database's) has passed or not, and only the Clock process moves them on. The remote's side of a deadline is the
 * Remote's choice to refuse a request in flight as arriving too late; once the database sees the deadline passed,
 * the remote refuses every request under that op key. A call arrives within its deadline unless it was in flight
 * (a late call is refused with no effect: the same as a rejection, MAX_REJECTS). A person's answer (done with the
 * receipt, or not done) is true when it is recorded. Not modelled: accepted/observing, backoff timing, approvals,
 * re-plans, compensation, cleanup, input re-checks, the event log and audit chain, a fence that lands late.
 *
 * The remote: it fences (tasks/engine/connectors.py:fence, a tombstone) unless -DREMOTE_CANNOT_FENCE, where every
 * final "not found" waits for the deadline (tasks/decide/decisions.py:not_found_final).
 *
 * Bounds (the state space is finite because of them; docs/verification.md "The protocol, model-checked"):
 *   W = 2 agents, 1 operator, 1 admin, 1 remote, 1 clock
 *   N = 2 nodes, node b depends on node a; node a may be sent under 2 op keys (one retry after a definite
 *       rejection), node b under 1 (a rejection of b exhausts its budget: the task pauses)
 *   MAX_CRASHES   = 1  a worker's process restarts anywhere in its run, losing its local state
 *   MAX_LOSSES    = 1  a call's answer (or a lookup's or a fence's) is lost: the caller times out, the request
 *                      may land later
 *   MAX_REJECTS   = 1  the remote rejects a request definitely (dependency unavailable)
 *   MAX_EXPIRIES  = 1  a live holder's lease expires under it (a slow step); a crashed holder's lease always
 *                      expires and lapses (no bound: it is never renewed)
 *   MAX_GRANTS    = 6  lease grants (epochs) in one run (every grant is a new epoch: the bound keeps it finite)
 *   the operator cancels at most once and takes over at most once; the admin forces a release at most once
 *   (CANCELS, TAKEOVERS, FORCES = 0 turn each off; model/check.py checks the model in configurations, each a
 *   subset of these, because all of them at once are too many states for CI's budget)
 *
 * Properties (each an assert at the step where it must hold, or the LTL formula `settles`):
 *   P1 one_authority   every commit made under a lease is made by the holder of the lease that is live at that
 *                      instant (the ghost `authority`, kept by the lease actions, not by the compare-and-set): at
 *                      most one principal commits at any task version, and a stale holder commits nothing
 *   P2 intent_first    no call is sent unless its op key is registered (commit 1) before it
 *   P3 one_effect      an op key causes at most one effect on the deduplicating remote
 *   P4 no_intent_after_cancel  no operation starts (commit 1) once a cancel is recorded
 *   P5 reconcile_first no operation starts while another is dispatched or unknown: those are reconciled first
 *   P6 settles         every run settles: completed, stopped or paused. Runs that go on for ever: the LTL
 *                      formula <>[] settled, under weak fairness (pan -a -f: every process that stays enabled
 *                      gets to move). Runs that stop (nothing can move): the Watchdog asserts settled then —
 *                      pan's fairness check passes over runs that stop, so the assert is needed.
 *   P7 not_done_stays_not_done  no op key is both recorded rejected (cancelled, not done, refused) and has an
 *                      effect at the remote — asserted wherever one is recorded rejected and wherever an effect
 *                      lands. A request may still be in flight (or about to be sent) when its caller gave up or
 *                      a lookup found nothing; so a not found, or a refusal of an op key sent before, closes the
 *                      operation only when it is final: the op key fenced (the tombstone, checked in the same atomic
 *                      step as the effect), or its deadline passed (a request after it has no effect). Until then a
 *                      cancel leaves it unknown (stopped with pending reconciliation), a person's not done is
 *                      refused, and it is asked again. Without a cancel or a person, not found sends the same op
 *                      key again and the remote deduplicates (P3).
 *
 * Sabotage (each must make spin report an error; tests/test_model_check.py):
 *   -DSABOTAGE_NO_FENCING         the compare-and-set checks the version but not the lease (epoch, live)  → P1
 *   -DSABOTAGE_INTENT_AFTER_CALL  the call is sent before commit 1                                        → P2
 *   -DSABOTAGE_NO_RECONCILE       the directive skips reconciliation and sends an open node again
 *                                 under a new op key (a blind retry)                                      → P5
 *   -DSABOTAGE_NO_DEDUP           the remote performs every request, even an op key it has seen           → P3
 *   -DSABOTAGE_NO_RESUME          a takeover ends without handing the task back (it stays with people)    → P6
 *   -DSABOTAGE_IGNORE_FENCE       the remote lands a request despite the op key's tombstone              → P7
 *   -DSABOTAGE_NOT_FOUND_FINAL    a not found is final before the deadline, with no fence                 → P7
 *   -DSABOTAGE_DEADLINE_AT_COMMIT the deadline read at the commit, after the lookup, not on the snapshot
 *                                 taken before it                                                        → P7
 *   -DSABOTAGE_WITHDRAW_SENT_INTENT  a cancel withdraws an operation sent before (not found, to be sent
 *                                 again) as if it had never been sent                                     → P7
 *   -DSABOTAGE_REFUSAL_FINAL      a refusal of a re-sent op key is final without a fence                  → P7
 */

#ifndef W
#define W 2
#endif
#define OPER (W + 1)        /* principal id of the operator; agents are 1..W */

/* each bound may be set with -D (model/check.py's configurations do) */
#ifndef MAX_CRASHES
#define MAX_CRASHES 1
#endif
#ifndef MAX_LOSSES
#define MAX_LOSSES 1
#endif
#ifndef MAX_REJECTS
#define MAX_REJECTS 1
#endif
#ifndef MAX_EXPIRIES
#define MAX_EXPIRIES 1
#endif
#ifndef MAX_GRANTS
#define MAX_GRANTS 6
#endif
#ifndef CANCELS
#define CANCELS 1       /* 0: the operator never cancels */
#endif
#ifndef TAKEOVERS
#define TAKEOVERS 1     /* 0: the operator never takes over */
#endif
#ifndef FORCES
#define FORCES 1        /* 0: the admin never forces a release */
#endif

/* task status (tasks/core/lifecycle.py:TaskStatus; observing and backing_off fold into running, failed is not reached) */
mtype = { T_PENDING, T_RUNNING, T_PAUSED, T_HUMAN, T_STOPPING, T_STOPPED_PENDING, T_STOPPED, T_COMPLETED };
/* node status (NodeStatus) */
#define N_PENDING 0
#define N_RUNNING 1
#define N_SUCCEEDED 2
/* operation status (OperationStatus; accepted is not modelled): none = no row */
#define O_NONE 0
#define O_INTENT 1
#define O_DISPATCHED 2
#define O_COMMITTED 3
#define O_REJECTED 4
#define O_UNKNOWN 5
/* lease row state on the database clock (leases/models.py:Lease.expires_at against leases/clock.py:now) */
#define L_LIVE 0
#define L_EXPIRED 1   /* past expires_at, inside the grace: nobody writes, only the holder may renew */
#define L_LAPSED 2    /* past the grace: the next acquire closes it */
/* what a call or lookup tells the caller (tasks/core/outcomes.py) */
#define R_COMMITTED 0
#define R_REJECTED 1
#define R_NOTFOUND 2
#define R_LOST 3      /* Failed(connection_interrupted): no answer */
#define R_FENCED 4    /* Fenced: the fence found no effect and refuses the op key from now on — final */
#define R_HELD 5      /* a refusal that is not final yet (a re-send refused, an earlier copy may still land) */
/* directive kinds (tasks/decide/decisions.py:Directive) */
#define D_STOP 0
#define D_DONE 1
#define D_RECONCILE 2
#define D_EXECUTE 3
#define D_FENCE 4     /* reconcile after a recorded cancel: the remote is fenced, not only asked */

/* op keys: node a (0) → keys 0, 1 (its retries); node b (1) → key 2 (tasks/core/opkeys.py:effect) */
#define K 3
#define NODE_OF(k) ((k) < 2 -> 0 : 1)
#define MAX_ATT(n) ((n) == 0 -> 2 : 1)
#define KEY_OF(n) ((n) == 0 -> node_att[0] : 2)   /* the op key of the node's next first send */

/* ------------------------------------------------------------------------------------------------ the database */
mtype status = T_PENDING;
byte version = 1;
bool cancel_req;            /* tasks.Task.cancel_requested_at IS NOT NULL */
bool reserved;              /* leases.LeaseReservation for the operator */
byte node_st[2];
byte node_att[2];           /* attempts spent (Node.attempts) */
byte op_st[K];
/* the task's lease: at most one open (the partial unique index), so one row is enough */
byte l_holder;              /* 0: no open lease */
byte l_epoch;               /* the latest grant's epoch */
byte l_state;
bool l_orphan;              /* its holder crashed: nobody renews or writes with it, so it lapses */
/* the remote (harness/simulator.py:Store) */
bool r_done[K];             /* state["ops"]: the receipt stored under the op key */
byte r_effects[K];          /* stats["by_op_key"]: side effects per op key */
bool in_flight[K];          /* a request sent under the op key that has not landed yet */
bool r_tomb[K];             /* the fence's tombstone under the op key: every later request under it is refused */
/* the deadline (Operation.not_after, sent with every request; refreshed when the op key is sent again), on the
   abstract database clock: true once not_after + the skew allowance has passed — the remote then refuses every
   request under the op key sent before (its own clock is past not_after), and a lookup's not found is final */
bool late[K];
byte calling[K];            /* workers between commit 1 and their call under the op key: a request not sent yet */
bool dl_wait;               /* the open operation closes only on a final answer and waits for its deadline (a cancel's
                               not found, or a re-send's refusal, not final yet): asked again then */

/* fault and grant budgets */
byte crashes, losses, rejects, expiries;
/* ghost: the epoch that may write now (0: none), kept by the lease actions only (P1) */
byte authority;

#define OPEN(k) (op_st[k] == O_DISPATCHED || op_st[k] == O_UNKNOWN)
#define ANY_OPEN (OPEN(0) || OPEN(1) || OPEN(2))
#define FIRST_OPEN (OPEN(0) -> 0 : (OPEN(1) -> 1 : 2))
#define IN_FLIGHT (in_flight[0] || in_flight[1] || in_flight[2])
#define FIRST_IN_FLIGHT (in_flight[0] -> 0 : (in_flight[1] -> 1 : 2))
#define ANY_DISPATCHED (op_st[0] == O_DISPATCHED || op_st[1] == O_DISPATCHED || op_st[2] == O_DISPATCHED)
#define ANY_INTENT (op_st[0] == O_INTENT || op_st[1] == O_INTENT || op_st[2] == O_INTENT)
#define FIRST_INTENT (op_st[0] == O_INTENT -> 0 : (op_st[1] == O_INTENT -> 1 : 2))
#define ENDED (status == T_COMPLETED || status == T_STOPPED)
#define SETTLED (ENDED || status == T_PAUSED)
/* tasks/core/lifecycle.py:PERMITS */
#define RUNNABLE (status == T_PENDING || status == T_RUNNING)
#define SETTLING (status == T_STOPPING || status == T_STOPPED_PENDING)
#define AGENT_MAY_SETTLE (RUNNABLE || SETTLING || status == T_PAUSED)
#define OPERATOR_MAY_SETTLE (SETTLING || status == T_HUMAN)
#define OPERATOR_MAY_DECIDE (SETTLING || status == T_HUMAN || status == T_STOPPED)

/* tasks/engine/cas.py:compare_and_set's lease check (leases/services.py:lease_check): open, this epoch, live */
#ifdef SABOTAGE_NO_FENCING
#define FENCED(who, ep) true
#else
#define FENCED(who, ep) (l_holder == (who) && l_epoch == (ep) && l_state == L_LIVE)
#endif

/* P1, at every commit made under a lease */
#define COMMIT_UNDER_LEASE(ep) assert((ep) == authority); version++

/* tasks/decide/decisions.py:cancel_status — after a cancel: stopping while work is in flight, stopped_pending while only
   unknowns remain, stopped once every operation is settled */
inline cancel_status() {
  if
  :: ANY_DISPATCHED -> status = T_STOPPING
  :: !ANY_DISPATCHED && ANY_OPEN -> status = T_STOPPED_PENDING
  :: !ANY_OPEN -> status = T_STOPPED
  fi
}

/* P7, wherever an op key is recorded rejected and wherever an effect lands: never both */
#define P7(k) assert(op_st[k] != O_REJECTED || r_effects[k] == 0)

/* tasks/decide/decisions.py:not_found_final — a lookup's not found is final once the deadline plus the skew has passed
   on the database clock of the snapshot read before the lookup was sent (`fin`, sampled there) */
#ifdef SABOTAGE_NOT_FOUND_FINAL
#define FINAL(k, fin) true                                  /* final at once, before the deadline, with no fence */
#else
#ifdef SABOTAGE_DEADLINE_AT_COMMIT
#define FINAL(k, fin) late[k]                               /* the clock read at the commit, after the lookup */
#else
#define FINAL(k, fin) fin
#endif
#endif
/* the task waits for its open operation's deadline before it is asked again (the directive's wait, wake_at) */
#define WAITS_FOR_DEADLINE (dl_wait && ANY_OPEN && !late[FIRST_OPEN])

/* state compaction, not behaviour: once an op key is closed and no request under it is in flight or about to be
   sent, its deadline and tombstone are read no more, so they are cleared (states that differ only in them are one state) */
inline forget(k) {
  if
  :: (op_st[k] == O_COMMITTED || op_st[k] == O_REJECTED) && !in_flight[k] && calling[k] == 0 ->
     late[k] = false; r_tomb[k] = false
  :: else
  fi
}

/* a rejection recorded: the operation closed, its node may run again under a new op key */
inline reject(k) {
  op_st[k] = O_REJECTED; node_st[NODE_OF(k)] = N_PENDING; P7(k); forget(k)
}

/* after a rejection (tasks/decide/decisions.py:cancel_status after a cancel; budget_exhausted; backing off) */
inline after_rejection(k) {
  if
  :: cancel_req -> cancel_status()
  :: !cancel_req && status == T_HUMAN -> skip              /* a person holding the task decides (_after_settling) */
  :: !cancel_req && status != T_HUMAN && node_att[NODE_OF(k)] >= MAX_ATT(NODE_OF(k)) -> status = T_PAUSED  /* budget_exhausted */
  :: else -> skip                                          /* backing off: a new op key next time */
  fi
}

/* tasks/decide/decisions.py:settle (its _committed, _failed, NotFound and Fenced branches), the change commit 2
   writes; `fin`: the not found is final (tasks/decide/decisions.py:not_found_final on the snapshot) */
inline settle(k, res, fin) {
  if
  :: res == R_COMMITTED ->
     dl_wait = false; op_st[k] = O_COMMITTED; node_st[NODE_OF(k)] = N_SUCCEEDED; forget(k);
     if
     :: cancel_req -> cancel_status()
     :: !cancel_req && status == T_HUMAN -> skip
     :: !cancel_req && status != T_HUMAN && node_st[0] == N_SUCCEEDED && node_st[1] == N_SUCCEEDED -> status = T_COMPLETED
     :: else -> status = T_RUNNING
     fi
  :: res == R_REJECTED || res == R_FENCED ->               /* _failed (dependency_unavailable, fenced, too late);
                                                              Fenced: never took effect and never will */
     dl_wait = false; reject(k); after_rejection(k)
  :: res == R_HELD ->                                       /* a re-send refused: unknown until its deadline */
     op_st[k] = O_UNKNOWN; dl_wait = true;
     if :: cancel_req -> cancel_status() :: else -> skip fi
  :: res == R_LOST ->                                       /* _failed: connection_interrupted → unknown */
     op_st[k] = O_UNKNOWN;
     if :: cancel_req -> cancel_status() :: else -> skip fi
  :: res == R_NOTFOUND ->
     if
     :: (cancel_req || dl_wait) && FINAL(k, fin) ->         /* never took effect, and no request can land now */
        dl_wait = false; reject(k); after_rejection(k)
     :: (cancel_req || dl_wait) && !FINAL(k, fin) ->        /* not final: stays unknown, asked again at the deadline */
        op_st[k] = O_UNKNOWN; dl_wait = true;
        if :: cancel_req -> cancel_status() :: else -> skip fi
     :: !cancel_req && !dl_wait -> op_st[k] = O_INTENT      /* sent again under the same op key */
     fi
  fi
}

/* harness/simulator.py:Store.lookup (GET /ops/<op_key>), as connector.lookup sees it: a receipt or not found,
   or no answer (a tombstone is not a receipt: not found) */
inline lookup(k, res) {
  if
  :: losses < MAX_LOSSES -> losses++; res = R_LOST
  :: true -> res = (r_done[k] -> R_COMMITTED : R_NOTFOUND)
  fi
}

/* tasks/engine/connectors.py:fence → harness/simulator.py:fence, one atomic step at the remote: the receipt if the
   effect landed, else a tombstone under the op key and Fenced; or no answer — the fence never arrived, or it
   landed and its answer was lost */
inline fence(k, res) {
  if
  :: losses < MAX_LOSSES -> losses++; res = R_LOST          /* never arrived */
  :: true ->
     if
     :: r_done[k] -> res = R_COMMITTED
     :: !r_done[k] -> r_tomb[k] = true; res = R_FENCED
     fi;
     if
     :: losses < MAX_LOSSES -> losses++; res = R_LOST       /* landed, its answer lost */
     :: true
     fi
  fi
}

/* harness/simulator.py:perform — a request lands at the remote: once per op key (it deduplicates: a stored receipt
   is answered first); a fresh one is refused with no effect under a tombstone or past its deadline, checked in the
   same atomic step as the effect */
#ifdef SABOTAGE_NO_DEDUP
#define FRESH(k) true
#else
#define FRESH(k) (!r_done[k])
#endif
#ifdef SABOTAGE_IGNORE_FENCE
#define REFUSED(k) (late[k])                                /* the tombstone ignored */
#else
#define REFUSED(k) (r_tomb[k] || late[k])
#endif
inline land(k, res) {
  if
  :: !FRESH(k) -> res = R_COMMITTED                         /* the stored receipt, no second effect */
  :: FRESH(k) && REFUSED(k) -> res = R_REJECTED             /* fenced, or too late: no effect */
  :: FRESH(k) && !REFUSED(k) && rejects < MAX_REJECTS -> rejects++; res = R_REJECTED
  :: FRESH(k) && !REFUSED(k) -> r_done[k] = true; r_effects[k]++; res = R_COMMITTED;
     assert(r_effects[k] <= 1);                             /* P3 one_effect */
     P7(k)
  fi
}

/* tasks/engine/connectors.py (connector.submit): POST /ops/<op_key>, then the answer or a timeout */
inline call(k, res) {
  atomic {
    assert(op_st[k] != O_NONE);                             /* P2 intent_first: registered before the call */
    if :: out -> calling[k]--; out = false :: else fi;
    if
    :: land(k, res)                                         /* the request lands, its answer comes back */
    :: losses < MAX_LOSSES -> losses++; land(k, res); res = R_LOST   /* lands; the answer is lost */
    :: losses < MAX_LOSSES -> losses++; in_flight[k] = true; res = R_LOST
                                                            /* the caller times out first: it lands later */
    fi;
    forget(k)
  }
}

/* ------------------------------------------------------------------------------------------------ processes */

/* the remote: a request still in flight lands (harness/simulator.py:Store.perform) — or is refused, fenced or too
   late; nobody hears its answer */
active proctype Remote() {
  byte k, res;
end:
  do
  :: atomic {
       IN_FLIGHT -> k = FIRST_IN_FLIGHT; in_flight[k] = false;
       if
       :: land(k, res)
       :: skip              /* it arrives after its deadline: refused, no effect */
       fi;
       forget(k); k = 0; res = 0
     }
  od
}

/* leases/clock.py:now advancing past a lease's expires_at, or an op key's not_after + skew (the database's clock;
   nobody else moves it) */
#ifdef REMOTE_CANNOT_FENCE
#define LATE_MAY_PASS(k) (!late[k] && OPEN(k) && (cancel_req || dl_wait || l_holder == OPER))
#endif
active proctype Clock() {
end:
  do
  :: atomic { l_holder != 0 && l_state == L_LIVE && (l_orphan || expiries < MAX_EXPIRIES) ->
       if :: !l_orphan -> expiries++ :: else -> skip fi;
       l_state = L_EXPIRED; authority = 0 }
  :: atomic { l_holder != 0 && l_state == L_EXPIRED -> l_state = L_LAPSED }
#ifdef REMOTE_CANNOT_FENCE
  /* an open operation's deadline passes (not_after + the skew) while the database waits for it to close: after a
     cancel, a held refusal, or with a person holding the task (who reads it); the remote's side of the deadline is
     the Remote's choice to refuse a late arrival */
  :: atomic { LATE_MAY_PASS(0) -> late[0] = true }
  :: atomic { LATE_MAY_PASS(1) -> late[1] = true }
  :: atomic { LATE_MAY_PASS(2) -> late[2] = true }
#endif
  od
}

/* tasks/engine/runner.py:run_task_once / run_steps: one agent, woken again and again (the recovery scan) */
proctype Worker(byte me) {
  byte ep, lv, k, res, d;
  bool fin;                 /* the snapshot's clock: the open operation's not found would be final */
  bool out;                 /* between commit 1 and the call (calling[k]) */
  bool again;               /* this call is a re-send of the op key: an earlier copy may still land */

idle:
  ep = 0; lv = 0; k = 0; res = 0; d = 0; fin = false; again = false;
end:
  /* leases/services.py:lease_acquire (a wake-up is sent for a task with work: not ended, paused or with people) */
  atomic {
    !SETTLED && status != T_HUMAN && !WAITS_FOR_DEADLINE && l_epoch < MAX_GRANTS && !reserved &&
    (l_holder == 0 || l_state == L_LAPSED) ->
    l_epoch++; l_holder = me; l_state = L_LIVE; l_orphan = false; ep = l_epoch; authority = ep
  };
  do
  :: /* tasks/engine/snapshot.py:task_snapshot + tasks/decide/decisions.py:directive (pure, on the snapshot) */
     atomic {
       lv = version; k = 0; fin = false;
       if
       :: status == T_COMPLETED -> d = D_DONE
       :: status == T_STOPPED -> d = D_STOP
       :: else ->
          if
          :: !(l_holder == me && l_epoch == ep && l_state == L_LIVE) -> d = D_STOP   /* lease_lost / _expired */
          :: else ->
             if
             :: status == T_HUMAN -> d = D_STOP
#ifndef SABOTAGE_NO_RECONCILE
             :: status != T_HUMAN && WAITS_FOR_DEADLINE -> d = D_STOP   /* wait: asked again at not_after + skew */
             :: status != T_HUMAN && ANY_OPEN && !WAITS_FOR_DEADLINE ->
                k = FIRST_OPEN;
#ifdef REMOTE_CANNOT_FENCE
                d = D_RECONCILE; fin = ((cancel_req || dl_wait) && late[k])  /* no fence: the deadline rule */
#else
                if :: cancel_req -> d = D_FENCE :: else -> d = D_RECONCILE fi
#endif
             :: status != T_HUMAN && !ANY_OPEN ->
#else
             :: status != T_HUMAN ->
#endif
                if
                :: cancel_req || reserved || status == T_PAUSED -> d = D_STOP
                :: else ->
                   if
                   :: ANY_INTENT -> d = D_EXECUTE; k = FIRST_INTENT
#ifdef SABOTAGE_NO_RECONCILE
                   /* a blind retry: an open node's operation is taken for failed and sent under a new key */
                   :: !ANY_INTENT && ANY_OPEN && NODE_OF(FIRST_OPEN) == 0 && node_att[0] < 2 ->
                      d = D_EXECUTE; k = node_att[0]
                   :: !ANY_INTENT && ANY_OPEN && !(NODE_OF(FIRST_OPEN) == 0 && node_att[0] < 2) -> d = D_STOP
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_PENDING && node_att[0] < 2 ->
                      d = D_EXECUTE; k = KEY_OF(0)
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_PENDING && node_att[0] >= 2 -> d = D_STOP
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_SUCCEEDED && node_st[1] == N_PENDING && node_att[1] < 1 -> d = D_EXECUTE; k = KEY_OF(1)
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_SUCCEEDED && node_st[1] == N_PENDING && node_att[1] >= 1 -> d = D_STOP
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_SUCCEEDED && node_st[1] == N_SUCCEEDED -> d = D_DONE
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_RUNNING -> d = D_STOP
                   :: !ANY_INTENT && !ANY_OPEN && node_st[0] == N_SUCCEEDED && node_st[1] == N_RUNNING -> d = D_STOP
#else
                   :: !ANY_INTENT && node_st[0] == N_PENDING && node_att[0] < 2 -> d = D_EXECUTE; k = KEY_OF(0)
                   :: !ANY_INTENT && node_st[0] == N_PENDING && node_att[0] >= 2 -> d = D_STOP  /* budget_exhausted */
                   :: !ANY_INTENT && node_st[0] == N_SUCCEEDED && node_st[1] == N_PENDING && node_att[1] < 1 ->
                      d = D_EXECUTE; k = KEY_OF(1)
                   :: !ANY_INTENT && node_st[0] == N_SUCCEEDED && node_st[1] == N_PENDING && node_att[1] >= 1 ->
                      d = D_STOP
                   :: !ANY_INTENT && node_st[0] == N_SUCCEEDED && node_st[1] == N_SUCCEEDED -> d = D_DONE
                   :: !ANY_INTENT && node_st[0] == N_RUNNING -> d = D_STOP
                   :: !ANY_INTENT && node_st[0] == N_SUCCEEDED && node_st[1] == N_RUNNING -> d = D_STOP
#endif
                   fi
                fi
             fi
          fi
       fi
     };
     if
     :: crashes < MAX_CRASHES -> goto crash
     :: true
     fi;
     if
     :: d == D_RECONCILE || d == D_FENCE ->
        /* tasks/engine/runner.py:run_steps, reconcile branch: connector.lookup(op_key), or after a recorded cancel
           connector.fence(op_key) */
        atomic {
          if
          :: d == D_RECONCILE -> lookup(k, res)
          :: d == D_FENCE -> fence(k, res)
          fi
        };
        if
        :: res == R_LOST -> break                              /* stopped_by remote_unreachable */
        :: else
        fi;
        if
        :: crashes < MAX_CRASHES -> goto crash
        :: true
        fi;
        /* tasks/engine/protocol.py:record_outcome → tasks/engine/cas.py:compare_and_set (kind settle, agent) */
        atomic {
          if
          :: version == lv && FENCED(me, ep) && AGENT_MAY_SETTLE && OPEN(k) ->
             settle(k, res, fin); COMMIT_UNDER_LEASE(ep)
          :: else -> break                                      /* refused: VersionConflict, LeaseLost, … */
          fi
        }
     :: d == D_EXECUTE ->
#ifdef SABOTAGE_INTENT_AFTER_CALL
        call(k, res);                                           /* the call first, commit 1 after it */
#endif
        /* tasks/engine/protocol.py:operation_start → tasks/decide/decisions.py:start → tasks/engine/cas.py:compare_and_set (kind start,
           requires cancel_requested_at IS NULL): commit 1, the operation registered as dispatched */
        atomic {
          if
          :: version == lv && FENCED(me, ep) && RUNNABLE && !cancel_req && (op_st[k] == O_INTENT || node_att[NODE_OF(k)] < MAX_ATT(NODE_OF(k))) ->
             assert(!cancel_req);                               /* P4 no_intent_after_cancel */
             assert(!ANY_OPEN);                                 /* P5 reconcile_first */
             if
             :: op_st[k] == O_INTENT -> op_st[k] = O_DISPATCHED; late[k] = false; again = true
                                                    /* _send_again: the same attempt, its not_after refreshed */
             :: else -> op_st[k] = O_DISPATCHED; node_st[NODE_OF(k)] = N_RUNNING; node_att[NODE_OF(k)]++
             fi;
             status = T_RUNNING;
#ifndef SABOTAGE_INTENT_AFTER_CALL
             calling[k]++; out = true;
#endif
             COMMIT_UNDER_LEASE(ep)
          :: else -> break
          fi
        };
        if
        :: crashes < MAX_CRASHES -> goto crash
        :: true
        fi;
#ifndef SABOTAGE_INTENT_AFTER_CALL
        call(k, res);
#endif
        /* a re-send refused: the refusal answers for this request, not for an earlier copy still in flight — it is
           final once the op key is fenced (the receipt if the earlier copy landed), or, on a remote that cannot
           fence, once the deadline has passed (tasks/engine/runner.py:run_steps) */
        if
        :: res == R_REJECTED && again ->
#ifdef REMOTE_CANNOT_FENCE
           res = R_HELD
#else
#ifndef SABOTAGE_REFUSAL_FINAL
           atomic { fence(k, res); if :: res == R_FENCED -> res = R_REJECTED :: else fi }
#endif
#endif
        :: else
        fi;
        again = false;
        if
        :: crashes < MAX_CRASHES -> goto crash
        :: true
        fi;
        /* tasks/engine/protocol.py:record_outcome → compare_and_set (kind settle): commit 2, the outcome */
        atomic {
          if
          :: version == lv + 1 && FENCED(me, ep) && AGENT_MAY_SETTLE && OPEN(k) ->
             settle(k, res, false); COMMIT_UNDER_LEASE(ep)
          :: else -> break
          fi
        }
     :: else -> break                                           /* done, or stop */
     fi;
     lv = 0; res = 0
  od;
  /* tasks/engine/runner.py:_run_holding → leases/services.py:lease_release (LeaseLost is suppressed) */
  atomic {
    if
    :: l_holder == me && l_epoch == ep -> l_holder = 0; authority = 0
    :: else
    fi
  };
  goto idle;

crash:
  /* the process restarts: its local state is gone; its lease stays open until it lapses on the clock */
  atomic {
    crashes++;
    if :: out -> calling[k]--; out = false; forget(k) :: else fi;  /* the call it was about to make is never sent */
    if
    :: l_holder == me && l_epoch == ep -> l_orphan = true
    :: else
    fi
  };
  goto idle
}

/* a person: cancel (tasks/people/cancel.py) and takeover (tasks/people/takeover.py) */
active proctype Operator() {
  byte ep, lv, k, res;

  if
  :: skip                                                       /* never cancels */
  :: CANCELS > 0 -> /* tasks/people/cancel.py:task_request_cancel (no lease, a person; its retry on VersionConflict makes it one atomic
        step at the instant it lands) → tasks/decide/decisions.py:cancel */
     atomic {
       if
       :: !cancel_req && !ENDED && !SETTLING ->
          cancel_req = true;
          /* intents never sent are withdrawn; the model has none (commit 1 registers and dispatches at once): its
             intents are operations a lookup found not found, to be sent again — sent before, a request may still
             land, so they stay open (unknown) for the fence or the deadline */
          for (k : 0 .. K - 1) {
            if
#ifdef SABOTAGE_WITHDRAW_SENT_INTENT
            :: op_st[k] == O_INTENT -> reject(k)                /* withdrawn as if never sent */
#else
            :: op_st[k] == O_INTENT -> op_st[k] = O_UNKNOWN
#endif
            :: else
            fi
          }
          k = 0;
          cancel_status();
          version++
       :: else                                                  /* already cancelled or ended: nothing to record */
       fi
     }
  fi;
  if
  :: goto done                                                  /* never takes over */
  :: TAKEOVERS > 0
  fi;

claim:
  /* tasks/people/takeover.py:takeover_claim: leases/services.py:lease_acquire for the operator (closing a lapsed lease),
     or _wait_for_holder: leases/services.py:lease_reserve + compare_and_set(takeover_requested, no lease) */
  atomic {
    if
    :: ENDED -> goto done                                       /* nothing to take over */
    :: !ENDED && l_epoch < MAX_GRANTS && (l_holder == 0 || l_state == L_LAPSED) ->
       l_epoch++; l_holder = OPER; l_state = L_LIVE; l_orphan = false; ep = l_epoch; authority = ep;
       reserved = false;                                        /* lease_unreserve */
       if :: !cancel_req -> status = T_HUMAN :: else fi;        /* compare_and_set(takeover_granted) */
       COMMIT_UNDER_LEASE(ep)
    :: !ENDED && l_holder != 0 && l_state != L_LAPSED ->
       if
       :: !reserved -> reserved = true; version++              /* takeover_requested */
       :: else
       fi;
       goto wait
    :: !ENDED && l_epoch >= MAX_GRANTS && (l_holder == 0 || l_state == L_LAPSED) -> goto done  /* the bound */
    fi
  };
held:
  /* the next holder reconciles every open operation by op key first (tasks/people/settlement.py:operation_settle_by_hand): done,
     with the remote's receipt; not done (tasks/decide/decisions.py:settle_not_done) only on a final not found — the
     server fences the op key, or (a remote that cannot fence) the deadline has passed; else it is refused
     (NotFoundNotFinal), the operation stays unknown and is asked again later */
  do
  :: atomic {
       lv = version;
       if
       :: !(l_holder == OPER && l_epoch == ep) -> goto claim     /* forced off, or lapsed and closed */
       :: l_holder == OPER && l_epoch == ep && l_state == L_LAPSED -> goto claim
       :: l_holder == OPER && l_epoch == ep && l_state == L_EXPIRED ->
          l_state = L_LIVE; authority = ep                      /* tasks/people/takeover.py:takeover_renew (in grace) */
       :: l_holder == OPER && l_epoch == ep && l_state == L_LIVE && ANY_OPEN ->
          k = FIRST_OPEN;
#ifdef REMOTE_CANNOT_FENCE
          res = R_NOTFOUND                                      /* the person looks at the remote when recording */
#else
          fence(k, res)                                         /* the receipt, or Fenced (the person: not done) */
#endif
       :: l_holder == OPER && l_epoch == ep && l_state == L_LIVE && !ANY_OPEN -> break
       fi
     };
     atomic {
       if
       :: version == lv && FENCED(OPER, ep) && OPERATOR_MAY_SETTLE && OPEN(k) && res != R_LOST ->
#ifdef REMOTE_CANNOT_FENCE
          /* the person's answer, true when recorded: done with the receipt, or not done — closed only once the
             deadline has passed */
          if
          :: r_done[k] -> settle(k, R_COMMITTED, false); COMMIT_UNDER_LEASE(ep)
          :: !r_done[k] && FINAL(k, late[k]) -> res = R_FENCED
          :: !r_done[k] && !FINAL(k, late[k]) -> skip           /* NotFoundNotFinal: nothing written */
          fi;
#else
          if
          :: res == R_COMMITTED -> settle(k, res, false); COMMIT_UNDER_LEASE(ep)
          :: else
          fi;
#endif
          if
          :: res == R_FENCED ->                                 /* settle_not_done: rejected, node pending */
             dl_wait = false; reject(k);
             if :: cancel_req -> cancel_status() :: else fi;
             COMMIT_UNDER_LEASE(ep)
          :: else
          fi
       :: else
       fi;
       k = 0; res = 0
     }
  od;
  /* tasks/people/takeover.py:takeover_submit: end_task completed when every node has its receipt, replan (paused
     needs_replan) when a node's budget is spent, else resume_agent; then leases/services.py:lease_release */
  atomic {
    if
    :: version == lv && FENCED(OPER, ep) && OPERATOR_MAY_DECIDE && !ANY_OPEN ->
       if
       :: cancel_req -> skip                                    /* a recorded cancel keeps its status */
       :: !cancel_req && node_st[0] == N_SUCCEEDED && node_st[1] == N_SUCCEEDED -> status = T_COMPLETED
       :: !cancel_req && !(node_st[0] == N_SUCCEEDED && node_st[1] == N_SUCCEEDED) && (node_att[0] >= 2 && node_st[0] != N_SUCCEEDED || node_att[1] >= 1 && node_st[1] != N_SUCCEEDED) ->
          status = T_PAUSED
#ifdef SABOTAGE_NO_RESUME
       :: else -> skip                                          /* the task stays with people, nobody decides */
#else
       :: else -> status = T_PENDING
#endif
       fi;
       COMMIT_UNDER_LEASE(ep);
       l_holder = 0; authority = 0
    :: else -> goto held
    fi
  };
  goto done;
wait:
  /* claims again once the agent lets go: its lease released, forced off, or lapsed */
  atomic { ENDED || l_holder == 0 || l_state == L_LAPSED -> goto claim };
done:
  skip
}

/* an admin: tasks/people/forced_release.py:lease_force_release → leases/services.py:lease_force_close, then a
   compare-and-set without a lease (force_release, person) that moves the version */
active proctype Admin() {
  if
  :: skip
  :: FORCES > 0 ->
end_force:                                                      /* waits for a holder to remove */
     atomic { l_holder != 0 -> l_holder = 0; authority = 0; version++ }
  fi
}

/* P6, the runs that stop: when nothing in the system can move any more (spin's timeout), the task is settled —
   unless the run used up the lease grants (MAX_GRANTS): such a run is cut off by the bound, not judged.
   The LTL formula below covers the runs that go on for ever; pan -f's weak fairness passes over runs that stop. */
active proctype Watchdog() {
end:
  timeout -> assert(SETTLED || l_epoch >= MAX_GRANTS)
}

init {
  atomic {
    byte i;
    for (i : 1 .. W) { run Worker(i) }
  }
}

/* P6: every run ends completed, stopped or paused (checked with pan -a -f: weak fairness) */
ltl settles { <> [] (status == T_COMPLETED || status == T_STOPPED || status == T_PAUSED) }
