/**
 * The stop flag, against a scripted server (a `fetch` that answers from a script, as the Python client's
 * tests/test_client.py does): what a live server cannot be made to say from here — a person's takeover asked while
 * the agent holds the lease — so that the port's checks before each side effect are seen to hold.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Actions, type Outcome, Reckon, committed, notFound } from "../src/index.js";

type Json = Record<string, unknown>;

function scripted(answers: [string, number, Json | null][]): { fetch: typeof fetch; asked: string[] } {
  const asked: string[] = [];
  const fake = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const path = new URL(String(input)).pathname.replace(/^\/api\/v1/, "");
    const said = `${init.method ?? "GET"} ${path}`;
    asked.push(said);
    const next = answers.shift();
    assert.ok(next, `nothing scripted for ${said}`);
    const [expected, status, body] = next;
    assert.equal(said, expected);
    return new Response(body === null ? null : JSON.stringify(body), { status, headers: { ETag: '"9"' } });
  };
  return { fetch: fake, asked };
}

const OPERATION = { op_key: "rk-x-p1-a-0", node: "a", purpose: "effect", request: { action: "t.write", input: {} } };
const LEASE = { lease_id: "L1", task_id: 7, epoch: 1, ttl_seconds: 60, renewal_seq: 0, task_version: 3 };

test("a started node is not sent once a stop is said, and is looked up instead", async () => {
  const script = scripted([
    [
      "POST /tasks/7/lease",
      201,
      {
        ...LEASE,
        takeover_requested: true,
        next: { kind: "execute", task_version: 4, started: true, operation: OPERATION },
      },
    ],
    ["GET /tasks/7/directive", 200, { kind: "reconcile", task_version: 4, op_key: OPERATION.op_key }],
    [
      "POST /tasks/7/operations/rk-x-p1-a-0/outcome",
      200,
      { task: { version: 5 }, next: { kind: "stop", task_version: 5, reason: "takeover_requested" } },
    ],
    ["DELETE /tasks/7/lease", 204, null],
  ]);
  const heard: string[] = [];
  const connector = new Actions({
    lookup: (opKey): Outcome => {
      heard.push(`lookup ${opKey}`);
      return notFound();
    },
    currentVersion: () => "1",
  }).action("t.write", (opKey) => {
    heard.push(`submit ${opKey}`);
    return committed("r");
  });

  const result = await new Reckon("http://reckon.invalid", "rk_t", { fetch: script.fetch }).run(7, connector);

  assert.deepEqual([result.status, result.reason], ["stopped", "takeover_requested"]);
  assert.deepEqual(heard, ["lookup rk-x-p1-a-0"]); // never sent
});

test("a directive to execute is not started once a cancel is said by the lease", async () => {
  const script = scripted([
    [
      "POST /tasks/7/lease",
      201,
      { ...LEASE, cancel_requested: true, next: { kind: "execute", task_version: 3, node_key: "a" } },
    ],
    ["DELETE /tasks/7/lease", 204, null],
  ]);
  const connector = new Actions({ lookup: () => notFound(), currentVersion: () => "1" });

  const result = await new Reckon("http://reckon.invalid", "rk_t", { fetch: script.fetch }).run(7, connector);

  assert.deepEqual([result.status, result.reason, result.steps], ["stopped", "cancel_requested", 0]);
  assert.deepEqual(script.asked, ["POST /tasks/7/lease", "DELETE /tasks/7/lease"]); // no intent registered
});

test("an action without a function is refused as invalid_params, nothing sent", async () => {
  const connector = new Actions({ lookup: () => notFound(), currentVersion: () => "1" });
  assert.deepEqual(await connector.submit("k", { action: "t.unknown", input: {} }), {
    result: "failed",
    failureClass: "invalid_params",
    detail: "no function for action 't.unknown'",
  });
});
