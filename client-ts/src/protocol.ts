/**
 * The step protocol over HTTP (docs/api.md): the Python client's `reckon_client/protocol.py`, ported exchange for
 * exchange, so that both clients follow one state machine.
 *
 * Each exchange is a generator that yields *effects* — an HTTP call to Reckon, a call to the author's connector, a
 * sleep — and receives their results; `Reckon` (client.ts) drives it with `fetch` and `await`. So the rules (intent
 * before call, the stop flag checked before each side effect, reconcile first, 412 → re-read, a lookup that cannot
 * reach the remote ends the run) live here only, and the driver only moves bytes.
 *
 * What the loop follows is the server's directive: reconcile comes before execute in it, so a run that starts after a
 * crash (SIGKILL anywhere) asks the remote what became of the operation in flight before it sends anything new. The
 * lease is asked for, and each outcome posted, with `start_next`: the answer carries the next directive — when that
 * is to execute a node, with its operation already registered and marked sent (in the receipt's commit, after an
 * outcome) — so a node in steady state is one request, and a task of n nodes n + 2 (docs/api.md, "A step in one
 * request").
 */

import { ApiError, RemoteUnreachable, isObject } from "./errors.js";
import { type Committed, type Outcome, checkedOutcome, committed, failed, outcomeJson } from "./outcomes.js";

// ------------------------------------------------------------------------------------------------------- effects

type Json = Readonly<Record<string, unknown>>;

/** One request to Reckon (`path` under /api/v1). The driver retries it on 429/503 and transport errors: safe, since
 * every write carries If-Match and an Idempotency-Key. */
export interface Call {
  readonly effect: "call";
  readonly method: "GET" | "POST" | "DELETE";
  readonly path: string;
  readonly body: unknown;
  readonly headers: Readonly<Record<string, string>>;
}

export interface Reply {
  readonly status: number;
  /** Lower-case names. */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: unknown;
}

/** What Reckon registered before the call: `{action, input}` with every input resolved, and the request's deadline
 * (`not_after`, ISO 8601 on the server's database clock) that a remote which cannot fence refuses it after. */
export interface OperationRequest {
  readonly action: string;
  readonly input: Json;
  readonly not_after?: string;
  readonly [field: string]: unknown;
}

/** A call to the connector (or, for `recreate`, to the caller's function). An error it throws is thrown back into
 * the generator. */
export type Remote =
  | {
      readonly effect: "remote";
      readonly name: "submit" | "compensate";
      readonly args: readonly [string, OperationRequest];
    }
  | {
      readonly effect: "remote";
      readonly name: "lookup" | "fence" | "currentVersion";
      readonly args: readonly [string];
    }
  | { readonly effect: "remote"; readonly name: "delete"; readonly args: readonly [string, string] }
  | { readonly effect: "remote"; readonly name: "recreate"; readonly args: readonly [] };

export interface Sleep {
  readonly effect: "sleep";
  readonly seconds: number;
}

/** The SHA-256 of `text`'s UTF-8 bytes, as hex: the driver asks the platform's Web Crypto (asynchronous, so it is an
 * effect like any other I/O). */
export interface Digest {
  readonly effect: "digest";
  readonly text: string;
}

export type Effect = Call | Remote | Sleep | Digest;
export type Steps<T> = Generator<Effect, T, unknown>;

function* call(
  method: Call["method"],
  path: string,
  body: unknown = null,
  headers: Readonly<Record<string, string>> = {},
): Steps<Reply> {
  return (yield { effect: "call", method, path, body, headers }) as Reply;
}

function* remote(effect: Remote): Steps<unknown> {
  return yield effect;
}

function* sleep(seconds: number): Steps<void> {
  yield { effect: "sleep", seconds };
}

// ------------------------------------------------------------------------------------------------------- results

/** A task as Reckon reads it (`raw` holds the whole body: nodes, open operations, …). */
export interface Task {
  readonly id: number;
  readonly kind: string;
  readonly project: string;
  readonly title: string;
  readonly status: string;
  readonly statusReason: string;
  readonly version: number;
  readonly cancelRequested: boolean;
  readonly raw: Json;
}

export function taskOf(body: unknown): Task {
  const raw = object(body);
  return {
    id: integer(raw["id"]),
    kind: text(raw["kind"]),
    project: text(raw["project"]),
    title: text(raw["title"]),
    status: text(raw["status"]),
    statusReason: text(raw["status_reason"]),
    version: integer(raw["version"], 0),
    cancelRequested: Boolean(raw["cancel_requested"]),
    raw,
  };
}

/**
 * How a run ended. `done`: the task completed (`reason` `cleanup_unsupported`: its temp resources are left, the
 * connector has no `delete`). `stopped`: `reason` says why (a directive's reason — cancel_requested,
 * takeover_requested, awaiting_approval, budget_exhausted, a pause — or a refusal's code: lease_held, lease_lost, …).
 * `waiting`: run again at `until` (a backoff longer than the run's `maxWait`, a remote that could not be asked, an
 * operation the remote still runs).
 */
export interface RunResult {
  readonly status: "done" | "stopped" | "waiting";
  readonly reason: string;
  readonly until: Date | null;
  /** Operations sent or settled by this run. */
  readonly steps: number;
  readonly detail: string;
  readonly done: boolean;
}

export function runResult(
  status: RunResult["status"],
  reason = "",
  { until = null, steps = 0, detail = "" }: { until?: Date | null; steps?: number; detail?: string } = {},
): RunResult {
  return { status, reason, until, steps, detail, done: status === "done" };
}

/** An object Reckon retained for a task. A checkpoint keeps `asCheckpoint()` — `{retained: id, version: n}` — never
 * the content; `ofCheckpoint` reads one back. */
export class RetainedRef {
  constructor(
    readonly taskId: number,
    readonly id: number,
    readonly version: number,
  ) {}

  asCheckpoint(): { retained: number; version: number } {
    return { retained: this.id, version: this.version };
  }

  static ofCheckpoint(taskId: number, checkpoint: Json): RetainedRef {
    return new RetainedRef(taskId, integer(checkpoint["retained"]), integer(checkpoint["version"]));
  }
}

/** Bytes (sensitive input, temp material) or, for a debug artifact, an object of minimal fields. */
export type Content = Uint8Array | Json;

/** A retained object as read: `content` is a debug artifact's fields (an object), the bytes of any other kind.
 * `ref` is the reference to keep (after `fetchOrRecreate`, the re-created object's). */
export interface Retained {
  readonly ref: RetainedRef;
  readonly kind: string;
  readonly name: string;
  readonly expiresAt: Date | null;
  readonly content: Content;
}

/** The lease a run holds, shared with its background renewer: the renewer moves `renewalSeq` and raises
 * `stopReason` (cancel_requested, takeover_requested, or the lease lost); the loop reads it before each side
 * effect. */
export class LeaseState {
  stopReason = "";
  lost = false;
  /** The first directive the grant's answer carried (start_next), for the loop to follow before reading any. */
  first: Json | null = null;

  constructor(
    readonly taskId: number,
    readonly leaseId: string,
    readonly epoch: number,
    readonly ttlSeconds: number,
    public renewalSeq: number,
  ) {}

  static of(body: unknown): LeaseState {
    const grant = object(body);
    const state = new LeaseState(
      integer(grant["task_id"]),
      text(grant["lease_id"]),
      integer(grant["epoch"], 0),
      Number(grant["ttl_seconds"]) || 30,
      integer(grant["renewal_seq"], 0),
    );
    state.first = isObject(grant["next"]) ? grant["next"] : null;
    state.heard(grant);
    return state;
  }

  /** A lease answer (acquire or renew): the next renewal_seq, and whether to stop starting side effects. */
  heard(body: unknown): void {
    const answer = object(body);
    this.renewalSeq = integer(answer["renewal_seq"], this.renewalSeq);
    if (answer["cancel_requested"]) {
      this.stopReason = this.stopReason || "cancel_requested";
    } else if (answer["takeover_requested"]) {
      this.stopReason = this.stopReason || "takeover_requested";
    }
  }

  get renewEvery(): number {
    return Math.max(this.ttlSeconds / 3, 0.1);
  }
}

// ------------------------------------------------------------------------------------------------------- helpers

export const LOST: ReadonlySet<string> = new Set(["lease_lost", "lease_expired"]);
export const BUSY: ReadonlySet<string> = new Set([
  "lease_held",
  "lease_reserved",
  "takeover_held",
  "takeover_requested",
]);
/** 412s in a row before a run gives up (someone else keeps moving the task). */
export const MAX_CONFLICTS = 20;
/** Seconds between two lookups of an operation the remote still runs. */
export const OBSERVE_EVERY = 2.0;
/** Seconds: the least a wait sleeps, so a clock ahead of the database's never spins. */
export const MIN_WAIT = 0.5;

/** The body of a 2xx; ApiError otherwise. */
export function ok(reply: Reply): unknown {
  if (reply.status >= 200 && reply.status < 300) return reply.body;
  throw ApiError.of(reply.status, reply.body);
}

export function etagVersion(reply: Reply): number | null {
  let tag = reply.headers["etag"] ?? "";
  if (tag.startsWith("W/")) tag = tag.slice(2);
  tag = tag.replace(/^"+|"+$/g, "");
  return /^\d+$/.test(tag) ? Number(tag) : null;
}

/** JSON with every object's keys sorted: the same body is always the same text. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (isObject(value)) {
    const fields = Object.keys(value)
      .filter((key) => value[key] !== undefined)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonicalJson(value[key])}`);
    return `{${fields.join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

function leaseHeaders(state: LeaseState): Record<string, string> {
  return { "Reckon-Lease": state.leaseId };
}

/** A write's headers: the lease, the version it was decided on, and one Idempotency-Key per lease, version and body
 * — a write retried after a lost answer replays its first answer (instead of a 412 for its own change), and a
 * different write can never reuse a key. */
function* writeHeaders(state: LeaseState, version: number, body: unknown): Steps<Record<string, string>> {
  const digest = String(yield { effect: "digest", text: canonicalJson(body) }).slice(0, 32);
  return {
    ...leaseHeaders(state),
    "If-Match": `"${version}"`,
    "Idempotency-Key": `rk-client:${state.leaseId}:${version}:${digest}`,
  };
}

export function parseTime(value: unknown): Date | null {
  if (typeof value !== "string" || !value) return null;
  const zoned = /(?:[zZ]|[+-]\d\d:?\d\d)$/.test(value) ? value : `${value}Z`;
  const moment = new Date(zoned);
  if (Number.isNaN(moment.getTime())) throw new RangeError(`not an ISO 8601 time: ${value}`);
  return moment;
}

function object(value: unknown): Json {
  return isObject(value) ? value : {};
}

function text(value: unknown): string {
  return value === undefined || value === null ? "" : String(value);
}

/** An integer field (JSON may carry it as `5.0` or, from a header, `"5"`); `fallback` when absent, else an error. */
function integer(value: unknown, fallback?: number): number {
  const number = typeof value === "string" && /^-?\d+$/.test(value) ? Number(value) : value;
  if (typeof number === "number" && Number.isInteger(number)) return number;
  if (fallback !== undefined && (value === undefined || value === null)) return fallback;
  throw new TypeError(`not an integer: ${JSON.stringify(value)}`);
}

function randomKey(): string {
  return globalThis.crypto.randomUUID();
}

// ------------------------------------------------------------------------------------------------------- exchanges

export interface CreateOptions {
  readonly project?: string;
  readonly attemptBudget?: number;
  /** The same key (and the same request) within 24 h answers the task made the first time. */
  readonly idempotencyKey?: string;
}

export function* createTask(kind: string, title: string, plan: Json, options: CreateOptions = {}): Steps<Task> {
  const body: Record<string, unknown> = { kind, title, plan };
  if (options.project) body["project"] = options.project;
  if (options.attemptBudget !== undefined) body["attempt_budget"] = options.attemptBudget;
  // Always keyed, so a retried create (an answer lost on the way back) never makes a second task.
  const key = options.idempotencyKey ?? `rk-client:create:${randomKey()}`;
  return taskOf(ok(yield* call("POST", "/tasks", body, { "Idempotency-Key": key })));
}

export function* getTask(taskId: number): Steps<Task> {
  return taskOf(ok(yield* call("GET", `/tasks/${taskId}`)));
}

/**
 * The last receipt Reckon recorded for a node's effect (once the node succeeded, the one that advanced it): what the
 * remote said it committed under `opKey`, with its data as reported.
 */
export interface NodeReceipt {
  readonly node: string;
  readonly nodeStatus: string;
  readonly opKey: string;
  readonly action: string;
  readonly receipt: Committed;
  readonly receivedAt: Date | null;
}

/** ApiError `receipt_not_found` (404) while the node has none; `node_not_found` when the current plan has no such node. */
export function* nodeReceipt(taskId: number, nodeKey: string): Steps<NodeReceipt> {
  const body = object(ok(yield* call("GET", `/tasks/${taskId}/nodes/${encodeURIComponent(nodeKey)}/receipt`)));
  const count = body["count"];
  return {
    node: text(body["node"]),
    nodeStatus: text(body["node_status"]),
    opKey: text(body["op_key"]),
    action: text(body["action"]),
    receipt: committed(text(body["remote_id"]), {
      remoteVersion: text(body["remote_version"]),
      count: count === undefined || count === null ? null : integer(count),
      digest: text(body["digest"]),
      data: object(body["data"]),
    }),
    receivedAt: typeof body["received_at"] === "string" ? new Date(body["received_at"]) : null,
  };
}

/** Ask Reckon to cancel (the creator may, without a lease). In-flight work settles; nothing new starts. */
export function* cancel(taskId: number, reason: string, version?: number): Steps<Task> {
  const headers: Record<string, string> = version !== undefined ? { "If-Match": `"${version}"` } : {};
  return taskOf(ok(yield* call("POST", `/tasks/${taskId}/cancel`, { reason }, headers)));
}

export interface RetainOptions {
  readonly ttlSeconds?: number;
  readonly idempotencyKey?: string;
}

/** Retain `content` as the next version of `name` (sealed, expiring); the answer is what a checkpoint keeps. Always
 * keyed, so a retry after a lost answer answers the same reference instead of retaining twice. */
export function* retain(
  taskId: number,
  kind: string,
  name: string,
  content: Content,
  options: RetainOptions = {},
): Steps<RetainedRef> {
  const body: Record<string, unknown> = { kind, name, content: contentJson(content) };
  if (options.ttlSeconds !== undefined) body["ttl_seconds"] = options.ttlSeconds;
  const key = options.idempotencyKey ?? `rk-client:retain:${randomKey()}`;
  const ref = object(ok(yield* call("POST", `/tasks/${taskId}/retained`, body, { "Idempotency-Key": key })));
  return new RetainedRef(taskId, integer(ref["retained"]), integer(ref["version"]));
}

/** The object's content while its retention lasts. Gone (410 `retention_expired`): ApiError — re-create it from
 * external facts (`fetchOrRecreate`); corrupt (409 `retention_corrupt`): ApiError, never re-created. */
export function* fetchRetained(ref: RetainedRef): Steps<Retained> {
  const path = `/tasks/${ref.taskId}/retained/${ref.id}/versions/${ref.version}`;
  const body = object(ok(yield* call("GET", path)));
  const content = body["content"];
  return {
    ref,
    kind: text(body["kind"]),
    name: text(body["name"]),
    expiresAt: parseTime(body["expires_at"]),
    content: isObject(content) ? content : fromBase64(text(content)),
  };
}

/** The object, or — when its retention has ended — the content the caller's `recreate` re-reads from external
 * facts, retained again as the next version of the same kind and name (the 410 names them). The answer's `ref` is
 * the one to keep in the checkpoint: never a reference to something that is gone. Anything else (not found,
 * corrupt) is an ApiError: re-creating over a corrupt object would hide what is wrong. */
export function* fetchOrRecreate(ref: RetainedRef): Steps<Retained> {
  let kind: unknown;
  let name: unknown;
  try {
    return yield* fetchRetained(ref);
  } catch (error) {
    if (!(error instanceof ApiError) || error.code !== "retention_expired") throw error;
    kind = error.problem["kind"];
    name = error.problem["name"];
    if (typeof kind !== "string" || typeof name !== "string") throw error;
  }
  const content = yield* remote({ effect: "remote", name: "recreate", args: [] });
  const fresh = yield* retain(ref.taskId, kind, name, checkedContent(content));
  return yield* fetchRetained(fresh);
}

function checkedContent(content: unknown): Content {
  if (content instanceof Uint8Array || isObject(content)) return content;
  throw new TypeError(`retained content is bytes (or, for a debug artifact, an object), not ${typeof content}`);
}

/** A debug artifact's fields as the JSON object they are; bytes as base64 text. */
function contentJson(content: Content): unknown {
  return content instanceof Uint8Array ? toBase64(content) : { ...checkedContent(content) };
}

function toBase64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

function fromBase64(encoded: string): Uint8Array {
  const binary = atob(encoded);
  return Uint8Array.from(binary, (char) => char.charCodeAt(0));
}

/** The lease, or why not: another holder (retried for up to `leaseWait` seconds: a crashed holder's lease lapses
 * after its ttl and grace), a person taking the task over, a status agents may not hold. */
export function* acquire(
  taskId: number,
  { ttlSeconds, leaseWait }: { ttlSeconds?: number | undefined; leaseWait: number },
): Steps<LeaseState | RunResult> {
  const key = `rk-client:lease:${randomKey()}`; // a lost answer retried replays the grant, not "held by you"
  let waited = 0;
  for (;;) {
    // start_next: the answer carries the first directive, and a node it says to execute is already started.
    const body = ttlSeconds ? { ttl_seconds: Math.round(ttlSeconds), start_next: true } : { start_next: true };
    const reply = yield* call("POST", `/tasks/${taskId}/lease`, body, { "Idempotency-Key": key });
    if (reply.status >= 200 && reply.status < 300) return LeaseState.of(reply.body);
    const refusal = ApiError.of(reply.status, reply.body);
    if (!BUSY.has(refusal.code) && refusal.code !== "lease_refused") throw refusal;
    if (!BUSY.has(refusal.code) || waited >= leaseWait) {
      return runResult("stopped", refusal.code, { detail: refusal.detail });
    }
    const pause = Math.min(1, leaseWait - waited);
    waited += pause;
    yield* sleep(pause);
  }
}

/** One renewal (the background renewer's step). A lease lost or lapsed raises the stop flag for good. */
export function* renew(state: LeaseState): Steps<void> {
  const seq = state.renewalSeq;
  // Keyed by lease and seq (the contract: every POST honours Idempotency-Key): a retry replays the renewal.
  const headers = { ...leaseHeaders(state), "Idempotency-Key": `rk-client:renew:${state.leaseId}:${seq}` };
  const reply = yield* call("POST", `/tasks/${state.taskId}/lease/renew`, { renewal_seq: seq }, headers);
  if (reply.status >= 200 && reply.status < 300) {
    state.heard(reply.body);
    return;
  }
  const refusal = ApiError.of(reply.status, reply.body);
  if (LOST.has(refusal.code)) {
    state.lost = true;
    state.stopReason = refusal.code;
    return;
  }
  if (refusal.code === "renewal_out_of_order") {
    // A renewal whose answer was lost did land (the server moved the seq): go on from the server's seq.
    const current = refusal.problem["renewal_seq"];
    const found = /lease is at (\d+)/.exec(refusal.detail);
    if (typeof current === "number" && Number.isInteger(current)) {
      state.renewalSeq = current;
    } else {
      state.renewalSeq = found?.[1] !== undefined ? Number(found[1]) : state.renewalSeq + 1;
    }
    return;
  }
  throw refusal;
}

export function* release(state: LeaseState): Steps<void> {
  const reply = yield* call("DELETE", `/tasks/${state.taskId}/lease`, null, leaseHeaders(state));
  if (reply.status >= 300 && !LOST.has(ApiError.of(reply.status, reply.body).code)) {
    throw ApiError.of(reply.status, reply.body);
  }
}

export interface StepOptions {
  readonly maxWait: number;
  /** The connector has `compensate`, sent a compensation's request instead of `submit`. */
  readonly compensate: boolean;
  /** The connector has `fence`, asked instead of `lookup` when the directive says so (a cancel is recorded). */
  readonly fences?: boolean;
  /** The connector has `delete(opKey, locator)`, called when the ended task's temp resources are to be deleted
   * (the directive `cleanup`); without it the run stops there (`cleanup_unsupported`) and they wait for a person. */
  readonly deletes?: boolean;
}

/** Follow the directive until done, stop, or a wait longer than `maxWait` seconds. */
export function* steps(state: LeaseState, options: StepOptions): Steps<RunResult> {
  const { maxWait, compensate, fences = false, deletes = false } = options;
  const base = `/tasks/${state.taskId}`;
  let done = 0;
  let conflicts = 0;
  // The next directive an answer carried (start_next): the grant's first, then each outcome's.
  let following: Json | null = state.first;
  state.first = null;
  for (;;) {
    if (state.lost) return runResult("stopped", state.stopReason, { steps: done });
    try {
      const d = following ?? object(ok(yield* call("GET", `${base}/directive`, null, leaseHeaders(state))));
      following = null;
      const kind = text(d["kind"]);
      const version = integer(d["task_version"]);
      const opKey = text(d["op_key"] || "");
      const reason = text(d["reason"] || "");
      if (kind === "done") return runResult("done", "", { steps: done });
      if (kind === "stop") return runResult("stopped", reason, { steps: done });
      if (kind === "wait") {
        const until = parseTime(d["until"]) ?? new Date();
        const pause = (until.getTime() - Date.now()) / 1000;
        if (pause > maxWait) return runResult("waiting", reason, { until, steps: done });
        yield* sleep(Math.max(pause, MIN_WAIT)); // at least a little: our clock is not the database's
      } else if (kind === "reconcile" && opKey) {
        const ask = fences && d["fence"] ? "fence" : "lookup";
        const askedAt = text(d["asked_at"] || "");
        const [ended, next] = yield* reconcile(state, base, opKey, version, maxWait, ask, askedAt);
        following = next;
        done += 1;
        if (ended !== null) return { ...ended, steps: done };
      } else if (kind === "reconcile") {
        yield* recheckInputs(state, base, object(d["input_refs"]), version);
      } else if (kind === "cleanup") {
        if (!deletes) {
          // The task has ended (reason: how); its temp resources are left for a person.
          const detail = "the connector has no delete(opKey, locator): the task's temp resources are left";
          const endedAs = reason === "completed" ? "done" : "stopped";
          return runResult(endedAs, "cleanup_unsupported", { steps: done, detail });
        }
        const ended = yield* cleanup(state, base, object(d["cleanup"]), version);
        done += 1;
        if (ended !== null) return { ...ended, steps: done };
      } else if (kind === "execute") {
        if (state.stopReason && !d["started"]) {
          // A cancel or a takeover was asked: start no side effect.
          return runResult("stopped", state.stopReason, { steps: done });
        }
        const [sent, next] = yield* execute(state, base, d, version, compensate);
        following = next;
        done += sent ? 1 : 0;
      } else {
        return runResult("stopped", `unknown_directive:${kind}`, { steps: done });
      }
      conflicts = 0;
    } catch (error) {
      if (error instanceof ApiError) {
        if (error.status === 412 && conflicts < MAX_CONFLICTS) {
          // The task moved: re-read the directive, never retry the write blindly.
          conflicts += 1;
          following = null;
          continue;
        }
        return runResult("stopped", error.code, { steps: done, detail: error.detail });
      }
      if (error instanceof Unreachable) {
        const until = new Date(Date.now() + OBSERVE_EVERY * 1000);
        return runResult("waiting", "remote_unreachable", { until, steps: done, detail: error.message });
      }
      throw error;
    }
  }
}

/** The connector could not reach the remote for a query: nothing was written; ask again later. */
class Unreachable extends Error {}

/** Whether an error a connector threw says its remote could not be reached (Python's `OSError`): `RemoteUnreachable`,
 * a system error (`ECONNREFUSED`, …), or `fetch`'s network failure. */
export function isUnreachable(error: unknown): boolean {
  if (error instanceof RemoteUnreachable) return true;
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === "string" && /^E[A-Z0-9_]+$/.test(code)) return true;
  return error instanceof TypeError && error.cause !== undefined && isUnreachable(error.cause);
}

/** Intent, call, outcome: whether the call was made (not when a stop came in between the intent and the call), and
 * the next directive the outcome's answer carried. A directive `started` by the previous outcome's answer needs no
 * intent: its operation was registered and marked sent in that answer's commit. */
function* execute(
  state: LeaseState,
  base: string,
  d: Json,
  version: number,
  compensate: boolean,
): Steps<[boolean, Json | null]> {
  let op: Json;
  if (d["started"] && isObject(d["operation"])) {
    op = d["operation"];
  } else {
    // Commit 1: the intent, recorded and marked sent before the call (the op key exists before anything can happen).
    const body = { node_key: text(d["node_key"]) };
    const reply = yield* call("POST", `${base}/operations`, body, (yield* writeHeaders(state, version, ["operations", body])));
    op = object(ok(reply));
    version = etagVersion(reply) ?? version + 1;
  }
  if (state.stopReason) {
    // Asked to stop while the intent was recorded: nothing is sent. The operation is open, so the next directive is
    // to look it up by op key (not found: settled as never sent), then to stop.
    return [false, null];
  }
  const name = compensate && op["purpose"] === "compensation" ? "compensate" : "submit";
  const opKey = text(op["op_key"]);
  const registered = object(op["request"]);
  const request: OperationRequest = {
    ...registered,
    action: text(registered["action"]),
    input: object(registered["input"]),
    // The deadline the remote refuses the request after (docs/api.md, a final not found).
    ...(op["not_after"] ? { not_after: text(op["not_after"]) } : {}),
  };
  const outcome = checkedOutcome(yield* remote({ effect: "remote", name, args: [opKey, request] }));
  // Commit 2: the receipt, and with it the next node's start when that is the next directive.
  const answer = yield* postOutcome(state, base, opKey, outcome, version);
  return [true, nextOf(answer)];
}

function* reconcile(
  state: LeaseState,
  base: string,
  opKey: string,
  version: number,
  maxWait: number,
  ask: "fence" | "lookup",
  askedAt: string,
): Steps<[RunResult | null, Json | null]> {
  let outcome: Outcome;
  try {
    outcome = checkedOutcome(yield* remote({ effect: "remote", name: ask, args: [opKey] }));
  } catch (error) {
    // A connector that threw instead of answering failed("connection_interrupted").
    if (isUnreachable(error)) throw new Unreachable(`${ask} of ${opKey}: ${String(error)}`);
    throw error;
  }
  if (outcome.result === "failed" && outcome.failureClass === "connection_interrupted") {
    throw new Unreachable(outcome.detail || `${ask} of ${opKey} failed`);
  }
  // A not found tells when the remote was asked: after this directive was read (the server's clock).
  const extra = outcome.result === "not_found" && askedAt ? { asked_at: askedAt } : {};
  const answer = yield* postOutcome(state, base, opKey, outcome, version, extra);
  if (outcome.result === "accepted") {
    // The remote still runs it: observe it, holding the lease, and ask again.
    if (maxWait < OBSERVE_EVERY) {
      return [runResult("waiting", "observing", { until: new Date(Date.now() + OBSERVE_EVERY * 1000) }), null];
    }
    yield* sleep(OBSERVE_EVERY);
    return [null, null]; // the directive is read again after the pause
  }
  if (integer(object(object(answer)["task"])["version"], version + 1) === version) {
    // Nothing new to record (still unprovable).
    return [runResult("waiting", "inconclusive", { until: new Date(Date.now() + OBSERVE_EVERY * 1000) }), null];
  }
  return [null, nextOf(answer)];
}

/** Delete exactly the temp resource's locator under the op key Reckon registered (`ask: delete`), or ask the remote
 * what became of a delete that may have been sent (`ask: lookup`: never sent again blindly); report the answer. A
 * remote that cannot be asked ends the run (nothing was written); the next one asks again. */
function* cleanup(state: LeaseState, base: string, work: Json, version: number): Steps<RunResult | null> {
  const opKey = text(work["op_key"]);
  const locator = text(work["locator"]);
  const tempId = integer(work["temp_id"]);
  const ask = work["ask"] === "delete" ? "delete" : "lookup";
  let outcome: Outcome;
  try {
    const effect: Remote =
      ask === "delete"
        ? { effect: "remote", name: "delete", args: [opKey, locator] }
        : { effect: "remote", name: "lookup", args: [opKey] };
    outcome = checkedOutcome(yield* remote(effect));
  } catch (error) {
    if (!isUnreachable(error)) throw error;
    if (ask === "lookup") throw new Unreachable(`lookup of ${opKey}: ${String(error)}`);
    // The delete may have reached the remote: report it unknown, the next directive asks.
    outcome = failed("connection_interrupted", `delete of ${locator}: ${String(error)}`);
  }
  if (ask === "lookup" && outcome.result === "failed" && outcome.failureClass === "connection_interrupted") {
    throw new Unreachable(outcome.detail || `lookup of ${opKey} failed`);
  }
  const body = { ...outcomeJson(outcome), op_key: opKey };
  const path = `${base}/temp-resources/${tempId}/cleanup`;
  const answer = ok(yield* call("POST", path, body, (yield* writeHeaders(state, version, [path, body]))));
  const until = new Date(Date.now() + OBSERVE_EVERY * 1000);
  if (outcome.result === "accepted") return runResult("waiting", "observing", { until }); // the remote still deletes
  if (integer(object(object(answer)["task"])["version"], version + 1) === version) {
    return runResult("waiting", "inconclusive", { until }); // nothing new (still unprovable)
  }
  return null;
}

/** Handed back by a person: read each input ref's version now and report them (a change pauses the task). */
function* recheckInputs(state: LeaseState, base: string, refs: Json, version: number): Steps<void> {
  const versions: Record<string, string> = {};
  for (const [name, value] of Object.entries(refs)) {
    const ref = isObject(value) ? object(value["ref"] ?? value) : {};
    try {
      versions[name] = text(yield* remote({ effect: "remote", name: "currentVersion", args: [text(ref["locator"])] }));
    } catch (error) {
      if (isUnreachable(error)) throw new Unreachable(`version of ${name}: ${String(error)}`);
      throw error;
    }
  }
  const body = { current_versions: versions };
  ok(yield* call("POST", `${base}/inputs`, body, (yield* writeHeaders(state, version, ["inputs", body]))));
}

function* postOutcome(
  state: LeaseState,
  base: string,
  opKey: string,
  outcome: Outcome,
  version: number,
  extra: Json = {},
): Steps<unknown> {
  // start_next: the answer carries the next directive, and a fresh node's start is written with the receipt.
  const body = { ...outcomeJson(outcome), ...extra, start_next: true };
  const path = `${base}/operations/${encodeURIComponent(opKey)}/outcome`;
  return ok(yield* call("POST", path, body, (yield* writeHeaders(state, version, [path, body]))));
}

/** The next directive an outcome's answer carries (null from a server that does not offer it: read it). */
function nextOf(answer: unknown): Json | null {
  const following = object(answer)["next"];
  return isObject(following) ? following : null;
}
