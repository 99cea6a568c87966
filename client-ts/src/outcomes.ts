/**
 * What an external system said about one operation: the shapes of the contract's Outcome (docs/api.md).
 *
 * A connector returns one of these and never throws for a remote's answer; the client posts it as the operation's
 * outcome. `failed("connection_interrupted")` means "unknown": Reckon settles it later by a lookup by op key, never
 * by sending again blindly. `result` is the contract's own word, so a plain object literal
 * (`{ result: "not_found" }`) is an outcome too.
 */

import { isObject } from "./errors.js";

export const FAILURE_CLASSES = [
  "invalid_params",
  "permission_revoked",
  "dependency_unavailable",
  "connection_interrupted",
  "conflict",
] as const;
export type FailureClass = (typeof FAILURE_CLASSES)[number];

/** The remote committed the write; the fields are the receipt (checked against the node's evidence spec). */
export interface Committed {
  readonly result: "committed";
  readonly remoteId: string;
  readonly remoteVersion?: string;
  readonly count?: number | null;
  readonly digest?: string;
  /** `{ temp: [locator, …] }`: what the write left behind at the remote, deleted once the task has ended. */
  readonly data?: Readonly<Record<string, unknown>>;
}

/** The remote accepted the write and is still running it: Reckon polls it later by op key. */
export interface Accepted {
  readonly result: "accepted";
  readonly remoteId: string;
}

/** A classified failure. `connection_interrupted`: the write may or may not have happened. */
export interface Failed {
  readonly result: "failed";
  readonly failureClass: FailureClass;
  readonly detail?: string;
}

/**
 * A query by op key found no trace yet: the write has not taken effect (it may be sent again, same op key; a cancel
 * closes it only once the request's deadline has passed).
 */
export interface NotFound {
  readonly result: "not_found";
}

/** The answer to `fence`: the remote took no effect under the op key and refuses it from now on (final). */
export interface Fenced {
  readonly result: "fenced";
}

/** The remote can neither dedupe nor be queried: a person decides. */
export interface Unprovable {
  readonly result: "unprovable";
  readonly detail?: string;
}

export type Outcome = Committed | Accepted | Failed | NotFound | Fenced | Unprovable;

export interface Receipt {
  readonly remoteVersion?: string;
  readonly count?: number | null;
  readonly digest?: string;
  readonly data?: Readonly<Record<string, unknown>>;
}

export function committed(remoteId: string, receipt: Receipt = {}): Committed {
  return { result: "committed", remoteId, ...receipt };
}

export function accepted(remoteId: string): Accepted {
  return { result: "accepted", remoteId };
}

export function failed(failureClass: FailureClass, detail = ""): Failed {
  return detail ? { result: "failed", failureClass, detail } : { result: "failed", failureClass };
}

export function notFound(): NotFound {
  return { result: "not_found" };
}

export function fenced(): Fenced {
  return { result: "fenced" };
}

export function unprovable(detail = ""): Unprovable {
  return detail ? { result: "unprovable", detail } : { result: "unprovable" };
}

/** The outcome as the body of `POST …/operations/{op_key}/outcome`: the remote id always, every other receipt field
 * only when given. */
export function outcomeJson(outcome: Outcome): Record<string, unknown> {
  switch (outcome.result) {
    case "committed": {
      const body: Record<string, unknown> = { result: "committed", remote_id: outcome.remoteId };
      if (outcome.remoteVersion) body["remote_version"] = outcome.remoteVersion;
      if (outcome.count !== undefined && outcome.count !== null) body["count"] = outcome.count;
      if (outcome.digest) body["digest"] = outcome.digest;
      if (outcome.data && Object.keys(outcome.data).length > 0) body["data"] = outcome.data;
      return body;
    }
    case "accepted":
      return { result: "accepted", remote_id: outcome.remoteId };
    case "failed":
      return outcome.detail
        ? { result: "failed", failure_class: outcome.failureClass, detail: outcome.detail }
        : { result: "failed", failure_class: outcome.failureClass };
    case "not_found":
      return { result: "not_found" };
    case "fenced":
      return { result: "fenced" };
    case "unprovable":
      return outcome.detail ? { result: "unprovable", detail: outcome.detail } : { result: "unprovable" };
  }
}

/** `value` if it is an Outcome; a TypeError otherwise (a connector must answer one of the contract's shapes). */
export function checkedOutcome(value: unknown): Outcome {
  if (isObject(value)) {
    const result = value["result"];
    const remoteId = typeof value["remoteId"] === "string";
    if (result === "committed" && remoteId) return value as unknown as Committed;
    if (result === "accepted" && remoteId) return value as unknown as Accepted;
    if (result === "failed" && (FAILURE_CLASSES as readonly unknown[]).includes(value["failureClass"])) {
      return value as unknown as Failed;
    }
    if (result === "not_found" || result === "fenced" || result === "unprovable") return value as unknown as Outcome;
  }
  const shown = isObject(value) ? JSON.stringify(value).slice(0, 200) : typeof value;
  throw new TypeError(`a connector must return an Outcome, not ${shown}`);
}
