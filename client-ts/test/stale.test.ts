/**
 * Stale state on the live server: an outcome sent with a version the task has left (412 version_conflict) is never
 * sent again blindly — the run reads the directive again, which says to reconcile the operation still open, asks the
 * store by op key and records what it says; a renewal sent with a sequence the lease has left (409
 * renewal_out_of_order) goes on from the sequence the server names. The requests are made stale on their way out
 * (a test's `fetch`); the refusals are the server's.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { KIND } from "../examples/migrate-agent.js";
import { Reckon } from "../src/index.js";
import { type Json, keyedPlan, live, named, nodeOf, source, tracedStore, uidOf, watch } from "./live.js";

test("a 412 is answered by reading the directive again and a 409 renewal by the server's sequence", async () => {
  const { url, token, store } = live();
  const project = "ts-stale";
  const from = await source(store, project);
  // The second copy takes 4 s at the store: long enough for two renewals of a 5 s lease.
  await store.fault("latency", { ms: 4000, action: "copy_batch", match: "-stl-copy-batch-2-" });
  let staleOutcome = "";
  let staleRenewal = false;
  const watched = watch({
    before: (request) => {
      const version = /^"(\d+)"$/.exec(request.headers["If-Match"] ?? "")?.[1];
      const copyOutcome = request.path.includes("-stl-copy-batch-1-") && request.path.endsWith("/outcome");
      if (!staleOutcome && copyOutcome && version) {
        staleOutcome = request.path;
        request.headers["If-Match"] = `"${Number(version) - 1}"`; // a version the task has left
      }
      if (!staleRenewal && request.path.endsWith("/lease/renew")) {
        staleRenewal = true;
        const body = request.body as Json;
        request.body = { ...body, renewal_seq: Number(body["renewal_seq"]) + 7 };
      }
    },
  });
  const reckon = new Reckon(url, token, { fetch: watched.fetch });
  const plan = keyedPlan("stl-", project, 1000, from, 500);
  const task = await reckon.createTask(KIND, "Migrate ts-stale", plan, { project });
  const { connector, calls } = tracedStore(store.url);

  const result = await reckon.run(task.id, connector, { ttlSeconds: 5 });

  assert.equal(result.status, "done", JSON.stringify(result));
  const exchanges = watched.log.filter((e) => named(e.request) !== "POST lease/renew");
  const at = exchanges.findIndex((e) => e.request.path === staleOutcome);
  assert.equal(exchanges[at]?.status, 412);
  assert.equal((exchanges[at]?.answer as Json)["code"], "version_conflict");
  const reread = exchanges[at + 1]!;
  assert.equal(named(reread.request), "GET directive");
  const directive = reread.answer as Json;
  assert.deepEqual([directive["kind"], nodeOf(String(directive["op_key"]))], ["reconcile", "stl-copy-batch-1"]);

  // The copy was sent once and looked up once; the store applied it once.
  const copy = calls.filter((c) => nodeOf(c.opKey) === "stl-copy-batch-1").map((c) => c.call);
  assert.deepEqual(copy, ["submit", "lookup"]);
  const effects = await store.effectsOf(uidOf(calls[0]!.opKey));
  assert.deepEqual(new Set(Object.values(effects)), new Set([1]));
  assert.equal(Object.keys(effects).length, 7);

  // The renewal with a sequence ahead of the lease's was refused with the lease's own, and the next one took it.
  const renewals = watched.log.filter((e) => named(e.request) === "POST lease/renew");
  assert.ok(renewals.length >= 2, `${renewals.length} renewals`);
  assert.deepEqual([renewals[0]!.status, (renewals[0]!.answer as Json)["code"]], [409, "renewal_out_of_order"]);
  assert.equal(renewals[1]!.status, 200);
  assert.equal((renewals[1]!.request.body as Json)["renewal_seq"], (renewals[0]!.answer as Json)["renewal_seq"]);
});
