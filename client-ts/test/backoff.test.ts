/**
 * Retryable failures, backed off: the store refuses a copy for now (503: failed dependency_unavailable) and the
 * server's directive says to wait; the run waits until then and sends the copy again under its retry's op key. And
 * Reckon's own 503 (an outcome whose answer was lost on the way, shown to the client as 503 with Retry-After) is
 * waited out and the same request sent again with the same Idempotency-Key: the server answers the first answer
 * again, and the write is applied once.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { KIND } from "../examples/migrate-agent.js";
import { Reckon } from "../src/index.js";
import { type Json, keyedPlan, live, nodeOf, source, tracedStore, uidOf, watch } from "./live.js";

test("a refusal for now is retried after the server's backoff and a lost answer after Retry-After", async () => {
  const { url, token, store } = live();
  const project = "ts-backoff";
  const from = await source(store, project);
  await store.fault("dependency_unavailable", { action: "copy_batch", match: "-bko-copy-batch-1-" });
  let lost = "";
  const watched = watch({
    after: (exchange) => {
      const path = exchange.request.path;
      if (lost || !path.includes("-bko-copy-batch-2-") || !path.endsWith("/outcome")) return undefined;
      lost = path; // it landed; the client is told the server was unavailable
      const problem = { code: "database_unavailable", status: 503, detail: "a test lost the answer" };
      return new Response(JSON.stringify(problem), {
        status: 503,
        headers: { "Content-Type": "application/problem+json", "Retry-After": "1" },
      });
    },
  });
  const reckon = new Reckon(url, token, { fetch: watched.fetch });
  const task = await reckon.createTask(KIND, "Migrate ts-backoff", keyedPlan("bko-", project, 1000, from, 500), {
    project,
  });
  const { connector, calls } = tracedStore(store.url);

  const result = await reckon.run(task.id, connector);

  assert.equal(result.status, "done", JSON.stringify(result));
  const uid = uidOf(calls[0]!.opKey);
  const effects = await store.effectsOf(uid);

  // The store's refusal: the copy's first op key took no effect; the retry (its own op key) did, after the wait the
  // failed outcome's answer said.
  const copies = calls.filter((c) => nodeOf(c.opKey) === "bko-copy-batch-1");
  assert.deepEqual(copies.map((c) => [c.call, c.opKey.slice(-2)]), [["submit", "-0"], ["submit", "-1"]]);
  assert.equal(effects[copies[0]!.opKey], undefined);
  assert.equal(effects[copies[1]!.opKey], 1);
  const failed = watched.log.find((e) => e.request.path.includes(`/operations/${copies[0]!.opKey}/outcome`))!;
  const wait = (failed.answer as Json)["next"] as Json;
  assert.equal(wait["kind"], "wait");
  const until = new Date(String(wait["until"])).getTime();
  assert.ok(copies[1]!.at >= until - 50, `sent again ${until - copies[1]!.at} ms before the backoff ended`);
  assert.ok(copies[1]!.at - copies[0]!.at >= 1000, "the retry came after a backoff");
  const node = ((await reckon.getTask(task.id)).raw["nodes"] as Json[]).find((n) => n["key"] === "bko-copy-batch-1");
  assert.equal(node?.["attempts"], 2);

  // Reckon's 503: waited out (Retry-After: 1) and sent again as it was; the server replays the first answer.
  const twice = watched.log.filter((e) => e.request.path === lost);
  assert.equal(twice.length, 2);
  assert.equal(twice[0]!.shown, 503);
  assert.deepEqual(twice[1]!.request.body, twice[0]!.request.body);
  assert.equal(twice[1]!.request.headers["Idempotency-Key"], twice[0]!.request.headers["Idempotency-Key"]);
  assert.equal(twice[1]!.headers["idempotent-replayed"], "true");
  assert.ok(twice[1]!.sentAt - twice[0]!.answeredAt >= 1000, "the retry waited Retry-After");
  assert.deepEqual(new Set(Object.values(effects)), new Set([1]));
  assert.equal(Object.keys(effects).length, 7); // five nodes' effects and two deletes, the refused op key aside
});
