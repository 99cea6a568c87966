/**
 * A small migration (prepare, two copies, verify, switch, then the copies' two staging objects deleted) run to
 * completion against the live server and store: each effect applied once by the store's own count, each operation
 * registered by Reckon before the store heard of it, and each node in steady state one request.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { KIND } from "../examples/migrate-agent.js";
import { Reckon } from "../src/index.js";
import { type Exchange, type Json, keyedPlan, live, named, nodeOf, source, tracedStore, uidOf, watch } from "./live.js";

test("a small migration runs to completion with each effect applied once at the store", async () => {
  const { url, token, store } = live();
  const project = "ts-migrate";
  const from = await source(store, project);
  const watched = watch();
  const reckon = new Reckon(url, token, { fetch: watched.fetch });
  const task = await reckon.createTask(KIND, "Migrate ts-migrate", keyedPlan("mig-", project, 1000, from, 500), {
    project,
  });
  const { connector, calls } = tracedStore(store.url);

  const result = await reckon.run(task.id, connector);
  const run = watched.log.slice(1); // the run's exchanges (the create was the first)

  assert.equal(result.status, "done", JSON.stringify(result));
  assert.equal((await reckon.getTask(task.id)).status, "completed");
  // What a step produced, read back from Reckon: the switch's receipt, under the op key the connector was sent.
  const switched = await reckon.nodeReceipt(task.id, "mig-switch-reference");
  assert.equal(switched.node, "mig-switch-reference");
  assert.ok(calls.some((c) => c.call === "submit" && c.opKey === switched.opKey), switched.opKey);
  assert.ok(switched.receipt.remoteId && switched.receivedAt instanceof Date);
  const submitted = calls.filter((c) => c.call === "submit").map((c) => nodeOf(c.opKey));
  assert.deepEqual(submitted, [
    "mig-prepare-target",
    "mig-copy-batch-1",
    "mig-copy-batch-2",
    "mig-verify-digests",
    "mig-switch-reference",
  ]);
  assert.equal(calls.filter((c) => c.call === "delete").length, 2); // the two staging objects
  assert.equal(calls.filter((c) => c.call === "lookup" || c.call === "fence").length, 0); // nothing to reconcile

  // The store's own count: seven op keys of this task, each applied exactly once.
  const uid = uidOf(calls[0]!.opKey);
  const effects = await store.effectsOf(uid);
  assert.deepEqual(effects, Object.fromEntries(calls.map((c) => [c.opKey, 1])));
  assert.equal(Object.keys(effects).length, 7);
  const objects = await store.objects();
  const target = Object.keys(objects).filter((key) => key.startsWith(`tgt-${project}-`));
  assert.equal(target.filter((key) => key.includes("/objects/")).length, 1000);
  assert.deepEqual(target.filter((key) => key.includes("/tmp/")), []); // the staging objects, deleted

  // Intent before call: every op key the store heard of was in an answer of Reckon's before the call.
  for (const c of calls) {
    const told = run.some((e) => e.answeredAt <= c.at && JSON.stringify(e.answer).includes(c.opKey));
    assert.ok(told, `${c.call} ${c.opKey} was sent before Reckon registered it`);
  }

  // One request per step: the grant's answer started the first node and each outcome's answer carries the next
  // directive, so no directive is read until the cleanup (whose report carries none). A node is started in its
  // predecessor's commit unless that receipt named a staging object (a copy's): then the answer's next is an
  // execute not started, and only then is an intent request made.
  const steps = run.filter((e) => named(e.request) !== "POST lease/renew");
  const requests = steps.map((e) => named(e.request));
  const cleanup = requests.indexOf("POST cleanup");
  assert.ok(!requests.slice(0, cleanup).includes("GET directive"), requests.join(", "));
  assert.equal(requests.filter((r) => r === "POST outcome").length, 5, requests.join(", "));
  const nextOf = (e: Exchange): Json => ((e.answer as Json)["next"] ?? {}) as Json;
  assert.deepEqual(requests.slice(0, 3), ["POST lease", "POST outcome", "POST outcome"]);
  assert.equal(nextOf(steps[0]!)["started"], true); // the grant: prepare-target, started
  assert.equal(nextOf(steps[1]!)["started"], true); // prepare-target's receipt: copy-batch-1, started
  steps.forEach((e, i) => {
    if (named(e.request) !== "POST operations") return;
    const before = nextOf(steps[i - 1]!);
    assert.deepEqual([before["kind"], before["started"]], ["execute", false], requests.join(", "));
  });
  assert.equal(requests.at(-1), "DELETE lease");
  // Every write carried If-Match, the lease and an Idempotency-Key.
  for (const e of run.filter((x) => /outcome|cleanup/.test(named(x.request)))) {
    assert.match(e.request.headers["If-Match"] ?? "", /^"\d+"$/);
    assert.ok(e.request.headers["Reckon-Lease"]);
    assert.match(e.request.headers["Idempotency-Key"] ?? "", /^rk-client:/);
  }
});
