/**
 * `Reckon`: the client. It drives the step protocol's generators (protocol.ts) with `fetch` and `await`; its
 * renewer is a timer on the same event loop.
 */

import type { Connector } from "./connector.js";
import { ApiError, TransportError } from "./errors.js";
import * as protocol from "./protocol.js";
import {
  type Call,
  type Content,
  type CreateOptions,
  LeaseState,
  type Remote,
  type Reply,
  type Retained,
  type RetainedRef,
  type RetainOptions,
  type RunResult,
  type Steps,
  type Task,
} from "./protocol.js";
import { MAX_ATTEMPTS, RETRY_STATUSES, apiBase, defaultHeaders, replyOf, retryDelay } from "./transport.js";

export interface ReckonOptions {
  /** Seconds one request may take (30). */
  readonly timeout?: number;
  /** The `fetch` to send with (the platform's by default): a proxy's, or a test's that watches the requests. */
  readonly fetch?: typeof fetch;
}

export interface RunOptions {
  /** The lease's time to live in seconds (5–3600; the server's default otherwise). */
  readonly ttlSeconds?: number;
  /** Seconds a `wait` directive may be slept through within the run (60); a longer one ends it as `waiting`. */
  readonly maxWait?: number;
  /** Seconds to keep asking for a lease another holder has (0): a crashed agent's lapses after its ttl plus grace. */
  readonly leaseWait?: number;
}

type Recreate = () => Content | Promise<Content>;

/**
 * A client for one agent token.
 *
 *     const reckon = new Reckon("http://127.0.0.1:8000", token);
 *     const task = await reckon.createTask("migrate_project_api", "Migrate acme", plan, { project: "acme" });
 *     const result = await reckon.run(task.id, connector);   // RunResult: done / stopped (reason) / waiting (until)
 */
export class Reckon {
  private readonly base: string;
  private readonly headers: Readonly<Record<string, string>>;
  private readonly timeout: number;
  private readonly send: typeof fetch;

  constructor(url: string, token: string, options: ReckonOptions = {}) {
    this.base = apiBase(url);
    this.headers = defaultHeaders(token);
    this.timeout = options.timeout ?? 30;
    this.send = options.fetch ?? ((input, init) => fetch(input, init));
  }

  // ------------------------------------------------------------------------------------------------ the surface

  /** Register a task with its plan. The same `idempotencyKey` (and the same request) within 24 h answers the task
   * made the first time: an agent that restarts can create "again" and resume its task. */
  createTask(
    kind: string,
    title: string,
    plan: Readonly<Record<string, unknown>>,
    options: CreateOptions = {},
  ): Promise<Task> {
    return this.drive(protocol.createTask(kind, title, plan, options));
  }

  getTask(taskId: number): Promise<Task> {
    return this.drive(protocol.getTask(taskId));
  }

  /** What a step produced, as Reckon recorded it: the receipt of the node's effect. */
  nodeReceipt(taskId: number, nodeKey: string): Promise<protocol.NodeReceipt> {
    return this.drive(protocol.nodeReceipt(taskId, nodeKey));
  }

  /** Ask Reckon to cancel (the creator may, without a lease). In-flight work settles; nothing new starts. */
  cancel(taskId: number, reason: string, options: { readonly version?: number } = {}): Promise<Task> {
    return this.drive(protocol.cancel(taskId, reason, options.version));
  }

  /**
   * Drive the task with `connector` until it is done, must stop, or must wait longer than `maxWait` seconds. The
   * lease is renewed in the background and released at the end, whatever happens (a connector that throws
   * included: the error is thrown on after the release).
   */
  async run(taskId: number, connector: Connector, options: RunOptions = {}): Promise<RunResult> {
    const { ttlSeconds, maxWait = 60, leaseWait = 0 } = options;
    const acquired = await this.drive(protocol.acquire(taskId, { ttlSeconds, leaseWait }));
    if (!(acquired instanceof LeaseState)) return acquired;
    const renewer = new Renewer(() => this.drive(protocol.renew(acquired)), acquired);
    try {
      const steps = protocol.steps(acquired, {
        maxWait,
        compensate: typeof connector.compensate === "function",
        fences: typeof connector.fence === "function",
        deletes: typeof connector.delete === "function",
      });
      return await this.drive(steps, connector);
    } finally {
      await renewer.stop();
      if (!acquired.lost) {
        try {
          await this.drive(protocol.release(acquired));
        } catch (error) {
          // Else it lapses by itself after its ttl.
          if (!(error instanceof ApiError) && !(error instanceof TransportError)) throw error;
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------------------ retained objects

  /** Seal `content` for the task as the next version of `name`, expiring after `ttlSeconds` (default: the kind's
   * retention). `kind`: `sensitive_input` or `temp_material` (bytes), `debug_artifact` (an object of minimal fields;
   * credential-like data is refused). Keep `ref.asCheckpoint()` in the checkpoint. */
  retain(
    taskId: number,
    kind: string,
    name: string,
    content: Content,
    options: RetainOptions = {},
  ): Promise<RetainedRef> {
    return this.drive(protocol.retain(taskId, kind, name, content, options));
  }

  /** The content while its retention lasts; `ApiError` `retention_expired` (410) once it has ended. */
  fetch(ref: RetainedRef): Promise<Retained> {
    return this.drive(protocol.fetchRetained(ref));
  }

  /** The content, or — once its retention has ended — what `recreate()` reads again from external facts, retained
   * as the next version. Keep the answer's `ref` in the checkpoint (it is new if it was re-created). */
  fetchOrRecreate(ref: RetainedRef, options: { readonly recreate: Recreate }): Promise<Retained> {
    return this.drive(protocol.fetchOrRecreate(ref), undefined, options.recreate);
  }

  // ------------------------------------------------------------------------------------------------ the driver

  private async drive<T>(steps: Steps<T>, connector?: Connector, recreate?: Recreate): Promise<T> {
    let value: unknown;
    let failure: { readonly error: unknown } | null = null;
    for (;;) {
      const next = failure !== null ? steps.throw(failure.error) : steps.next(value);
      if (next.done) return next.value;
      value = undefined;
      failure = null;
      const effect = next.value;
      try {
        if (effect.effect === "call") {
          value = await this.request(effect);
        } else if (effect.effect === "remote") {
          value = await perform(effect, connector, recreate);
        } else if (effect.effect === "digest") {
          value = await sha256Hex(effect.text);
        } else {
          await pause(effect.seconds);
        }
      } catch (error) {
        failure = { error }; // handed to the protocol, which decides (most propagate)
      }
    }
  }

  private async request(call: Call): Promise<Reply> {
    const headers: Record<string, string> = { ...this.headers, ...call.headers };
    let body: string | undefined;
    if (call.body !== null && call.body !== undefined) {
      body = JSON.stringify(call.body);
      headers["Content-Type"] = "application/json";
    }
    for (let attempt = 0; ; attempt++) {
      const last = attempt === MAX_ATTEMPTS - 1;
      let reply: Reply;
      try {
        const init: RequestInit = { method: call.method, headers, signal: AbortSignal.timeout(this.timeout * 1000) };
        if (body !== undefined) init.body = body;
        const response = await this.send(this.base + call.path, init);
        reply = replyOf(response.status, response.headers, await response.text());
      } catch (error) {
        if (last) throw new TransportError(`${call.method} ${call.path}: ${String(error)}`, { cause: error });
        await pause(retryDelay(attempt));
        continue;
      }
      if (RETRY_STATUSES.has(reply.status) && !last) {
        await pause(retryDelay(attempt, reply.headers["retry-after"]));
        continue;
      }
      return reply;
    }
  }
}

async function perform(effect: Remote, connector?: Connector, recreate?: Recreate): Promise<unknown> {
  if (effect.name === "recreate") {
    if (recreate === undefined) throw new TypeError("fetchOrRecreate needs a recreate function");
    return recreate();
  }
  if (connector === undefined) throw new TypeError(`a connector is needed to ${effect.name}`);
  switch (effect.name) {
    case "submit":
      return connector.submit(...effect.args);
    case "compensate":
      return connector.compensate ? connector.compensate(...effect.args) : connector.submit(...effect.args);
    case "lookup":
      return connector.lookup(...effect.args);
    case "fence":
      return connector.fence ? connector.fence(...effect.args) : connector.lookup(...effect.args);
    case "currentVersion":
      return connector.currentVersion(...effect.args);
    case "delete":
      if (!connector.delete) throw new TypeError("the connector has no delete(opKey, locator)");
      return connector.delete(...effect.args);
  }
}

function pause(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

/** Renews the lease every ttl/3 until stopped; a renewal's answer may raise the run's stop flag. */
class Renewer {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private renewing: Promise<void> = Promise.resolve();
  private halted = false;

  constructor(
    private readonly renewOnce: () => Promise<void>,
    private readonly state: LeaseState,
  ) {
    this.schedule();
  }

  private schedule(): void {
    if (this.halted || this.state.lost) return;
    this.timer = setTimeout(() => {
      // A failed renewal is tried again next tick; writes also extend the lease.
      this.renewing = this.renewOnce().then(
        () => this.schedule(),
        () => this.schedule(),
      );
    }, this.state.renewEvery * 1000);
  }

  async stop(): Promise<void> {
    this.halted = true;
    clearTimeout(this.timer);
    await this.renewing;
  }
}

/** SHA-256 of `text`'s UTF-8 bytes as hex, by the platform's Web Crypto (`globalThis.crypto`: Node 20+, Deno, Bun,
 * browsers). */
export async function sha256Hex(text: string): Promise<string> {
  const hash = await globalThis.crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(hash), (byte) => byte.toString(16).padStart(2, "0")).join("");
}
