/**
 * What needs no server: the outcomes' wire shapes (as the Python client's test_outcomes_are_the_contracts_shapes),
 * the idempotency key's digest, the transport's rules.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import {
  type Outcome,
  accepted,
  committed,
  failed,
  fenced,
  notFound,
  outcomeJson,
  unprovable,
} from "../src/index.js";
import { checkedOutcome } from "../src/outcomes.js";
import { canonicalJson, etagVersion, parseTime } from "../src/protocol.js";
import { sha256Hex } from "../src/client.js";
import { apiBase, retryDelay } from "../src/transport.js";

test("outcomes are the contract's shapes", () => {
  const cases: [Outcome, Record<string, unknown>][] = [
    [committed("r1"), { result: "committed", remote_id: "r1" }],
    [
      committed("r2", { remoteVersion: "7", count: 0, digest: "sha256:x", data: { temp: ["t"] } }),
      {
        result: "committed",
        remote_id: "r2",
        remote_version: "7",
        count: 0,
        digest: "sha256:x",
        data: { temp: ["t"] },
      },
    ],
    [
      committed("r3", { remoteVersion: "", count: null, digest: "", data: {} }),
      { result: "committed", remote_id: "r3" },
    ],
    [accepted("r4"), { result: "accepted", remote_id: "r4" }],
    [failed("conflict"), { result: "failed", failure_class: "conflict" }],
    [
      failed("dependency_unavailable", "503"),
      { result: "failed", failure_class: "dependency_unavailable", detail: "503" },
    ],
    [notFound(), { result: "not_found" }],
    [fenced(), { result: "fenced" }],
    [unprovable("no query"), { result: "unprovable", detail: "no query" }],
    [{ result: "not_found" }, { result: "not_found" }],
  ];
  for (const [outcome, body] of cases) assert.deepEqual(outcomeJson(checkedOutcome(outcome)), body);
  for (const wrong of [null, "committed", { result: "committed" }, { result: "failed", failureClass: "oops" }, {}]) {
    assert.throws(() => checkedOutcome(wrong), TypeError);
  }
});

test("the idempotency key's digest is SHA-256 of the canonical JSON", async () => {
  for (const text of ["", "abc", "é€😀", "x".repeat(55), "x".repeat(56), "x".repeat(64), "y".repeat(1000)]) {
    assert.equal(await sha256Hex(text), createHash("sha256").update(text, "utf8").digest("hex"));
  }
  assert.equal(canonicalJson({ b: 1, a: [{ d: null, c: "x" }], e: undefined }), '{"a":[{"c":"x","d":null}],"b":1}');
});

test("the transport's rules: the API's root, a bounded jittered backoff, the ETag's version", () => {
  assert.equal(apiBase("http://h:8000/"), "http://h:8000/api/v1");
  assert.equal(apiBase("http://h:8000/api/v1"), "http://h:8000/api/v1");
  for (let attempt = 0; attempt < 12; attempt++) {
    const delay = retryDelay(attempt);
    assert.ok(delay >= Math.min(0.25 * 2 ** attempt, 60) && delay <= Math.min(0.25 * 2 ** attempt, 60) * 1.25);
  }
  assert.ok(retryDelay(0, "3") >= 3 && retryDelay(0, "3") <= 3.75);
  assert.ok(retryDelay(0, "3600") <= 75);
  assert.ok(retryDelay(1, "Wed, 21 Oct 2015 07:28:00 GMT") <= 0.625);
  assert.equal(etagVersion({ status: 200, headers: { etag: 'W/"12"' }, body: null }), 12);
  assert.equal(etagVersion({ status: 200, headers: {}, body: null }), null);
  assert.equal(parseTime("2030-01-02T03:04:05")?.toISOString(), "2030-01-02T03:04:05.000Z");
  assert.equal(parseTime("2030-01-02T03:04:05+01:00")?.toISOString(), "2030-01-02T02:04:05.000Z");
});
