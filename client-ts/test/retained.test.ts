/**
 * Retained objects on the live server: bytes and a debug artifact retained and read back as they were sent; once a
 * retention has ended (410 retention_expired), `fetchOrRecreate` re-reads the external facts and retains them as the
 * next version of the same name, and answers the new reference.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { KIND } from "../examples/migrate-agent.js";
import { ApiError, Reckon, RetainedRef } from "../src/index.js";
import { keyedPlan, live, sleep, source } from "./live.js";

test("retained objects are read back, and re-created from external facts once their retention has ended", async () => {
  const { url, token, store } = live();
  const project = "ts-retained";
  const reckon = new Reckon(url, token);
  const plan = keyedPlan("ret-", project, 10, await source(store, project), 10);
  const task = await reckon.createTask(KIND, "Retain", plan, { project });
  const bytes = new Uint8Array(70_000).map((_, i) => (i * 7) % 256);
  const context = await reckon.retain(task.id, "sensitive_input", "context", bytes, { ttlSeconds: 1 });
  const artifact = await reckon.retain(task.id, "debug_artifact", "list-503", { tool: "store.list", status: 503 });

  const read = await reckon.fetch(RetainedRef.ofCheckpoint(task.id, context.asCheckpoint()));
  assert.deepEqual([read.kind, read.name, read.content], ["sensitive_input", "context", bytes]);
  assert.deepEqual((await reckon.fetch(artifact)).content, { tool: "store.list", status: 503 });

  await sleep(1500); // the context's retention ends
  await assert.rejects(reckon.fetch(context), (error) => error instanceof ApiError && error.status === 410);
  let recreated = 0;
  const again = await reckon.fetchOrRecreate(context, {
    recreate: () => {
      recreated += 1;
      return new TextEncoder().encode("read again from the source");
    },
  });
  assert.equal(recreated, 1);
  assert.deepEqual([again.ref.id !== context.id, again.ref.version, again.kind], [true, 2, "sensitive_input"]);
  assert.equal(new TextDecoder().decode(again.content as Uint8Array), "read again from the source");
  const kept = await reckon.fetchOrRecreate(artifact, {
    recreate: () => assert.fail("a live object is not re-created"),
  });
  assert.deepEqual(kept.ref, artifact);
});
