/**
 * A cancel that comes in between two steps: the task's creator cancels while the first copy is in the store's
 * hands (after the store committed it, before the agent posted its outcome). The run sees it at its next step —
 * the outcome it posts is refused (412: the cancel moved the task), the directive it reads again says to fence the
 * copy in flight — settles the copy as it truly ended, deletes its staging object, and starts nothing after.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { KIND, ObjectStore } from "../examples/migrate-agent.js";
import { type OperationRequest, type Outcome, Reckon } from "../src/index.js";
import { type StoreCall, keyedPlan, live, named, nodeOf, source, uidOf, watch } from "./live.js";

test("a cancel seen between steps settles the step in flight and starts nothing after", async () => {
  const { url, token, store } = live();
  const project = "ts-cancel";
  const from = await source(store, project);
  const creator = new Reckon(url, token);
  const task = await creator.createTask(KIND, "Migrate ts-cancel", keyedPlan("cxl-", project, 1500, from, 500), {
    project,
  });
  const calls: StoreCall[] = [];
  let cancelledAt = 0;

  class CancelledMidCopy extends ObjectStore {
    override async submit(opKey: string, request: OperationRequest): Promise<Outcome> {
      const outcome = await super.submit(opKey, request);
      if (nodeOf(opKey) === "cxl-copy-batch-1" && !cancelledAt) {
        await creator.cancel(task.id, "the migration was called off");
        cancelledAt = Date.now();
      }
      return outcome;
    }
  }
  const connector = new CancelledMidCopy(store.url, 10, (call, opKey) => calls.push({ call, opKey, at: Date.now() }));
  const watched = watch();

  const result = await new Reckon(url, token, { fetch: watched.fetch }).run(task.id, connector, { ttlSeconds: 5 });

  assert.equal(result.status, "stopped", JSON.stringify(result));
  assert.ok(["stopped", "cancel_requested"].includes(result.reason), result.reason);
  const after = await creator.getTask(task.id);
  assert.deepEqual([after.status, after.cancelRequested], ["stopped", true]);

  const copy = calls.find((c) => c.call === "submit" && nodeOf(c.opKey) === "cxl-copy-batch-1")!;
  const seen = calls.map((c) => `${c.call} ${nodeOf(c.opKey) || "cleanup"}`);
  // The copy in flight was fenced (a cancel is recorded: "what became of it; if nothing, refuse it from now on"):
  // the store answered committed, so it is settled as committed and its staging object deleted. Nothing else.
  assert.deepEqual(seen, [
    "submit cxl-prepare-target",
    "submit cxl-copy-batch-1",
    "fence cxl-copy-batch-1",
    "delete cleanup",
  ]);
  assert.ok(calls.filter((c) => c.at > cancelledAt).every((c) => c.call !== "submit"), "nothing sent after the cancel");

  const requests = watched.log.map((e) => `${named(e.request)} ${e.status}`);
  const refused = requests.indexOf("POST outcome 412");
  assert.ok(refused > 0, requests.join(", "));
  assert.equal(requests[refused + 1], "GET directive 200", "the task moved: the directive is read again");
  assert.ok(!requests.includes("POST operations 201"), "no intent registered after the cancel");

  const effects = await store.effectsOf(uidOf(copy.opKey));
  assert.deepEqual(Object.values(effects), [1, 1, 1]); // prepare, the copy, its staging object's delete
  assert.equal(effects[copy.opKey], 1);
});
