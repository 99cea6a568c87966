/**
 * What an agent author writes: one connector per external system, three calls (`compensate`, `fence` and `delete`
 * optional).
 *
 *     const store: Connector = {
 *       async submit(opKey, request) { … },     // send request.input for request.action, keyed by opKey
 *       async lookup(opKey) { … },              // what became of opKey? committed / accepted / not_found / …
 *       async currentVersion(locator) { … },    // an input ref's version now (throw RemoteUnreachable if it cannot)
 *     };
 *
 * `request` is the operation Reckon registered before the call: `{action, input}` with every input resolved. The
 * op key is the remote's idempotency key: sending the same op key twice must not write twice. A `lookup` that
 * cannot reach the remote answers `failed("connection_interrupted")`: the run stops and the next one asks again.
 *
 * A final "not found" (docs/api.md): `request.not_after` is the request's deadline (ISO 8601, the server's database
 * clock); a remote that cannot fence must refuse a request that reaches it later — answer that refusal as
 * `failed("dependency_unavailable")` (no effect, retried on the budget), never `notFound()`. A connector whose
 * remote can fence adds `fence(opKey)`: what became of opKey, and if nothing, refuse it from now on (`fenced()`) —
 * asked instead of `lookup` once a cancel is recorded, so the cancel need not wait for the deadline.
 *
 * Temp resources (docs/api.md, "Cleanup"): a receipt may name what the write left behind
 * (`committed(id, {data: {temp: [locator, …]}})`, a staging copy). Once the task has ended, Reckon tells the agent
 * to delete each under an op key of its own; a connector with `delete(opKey, locator)` does it. Without one the
 * client stops at that directive (`cleanup_unsupported`) and the temp resources are listed for a person.
 *
 * Every method may answer a Promise (the usual) or a value. A method that blocks the event loop holds up the
 * lease's renewals meanwhile: keep the remote's I/O asynchronous.
 */

import { type Outcome, failed } from "./outcomes.js";
import type { OperationRequest } from "./protocol.js";

export type Answer<T> = T | Promise<T>;

export interface Connector {
  submit(opKey: string, request: OperationRequest): Answer<Outcome>;
  lookup(opKey: string): Answer<Outcome>;
  currentVersion(locator: string): Answer<string>;
  /** The undo of an irreversible node's action (an operation of purpose `compensation`); `submit` without it. */
  compensate?(opKey: string, request: OperationRequest): Answer<Outcome>;
  /** What became of opKey; if nothing, the remote refuses it from now on (`fenced()`). */
  fence?(opKey: string): Answer<Outcome>;
  /** Delete exactly `locator` (a temp resource a receipt named in `data.temp`) under `opKey`, the remote's
   * idempotency key: a second delete under the same op key deletes nothing more. Answers like `submit`
   * (`committed` with the remote's id is the cleanup receipt; a remote that cannot do it now,
   * `failed("dependency_unavailable")`: Reckon backs off and spends no attempt). */
  delete?(opKey: string, locator: string): Answer<Outcome>;
}

export type Send = (opKey: string, input: Readonly<Record<string, unknown>>) => Answer<Outcome>;

/**
 * A connector made of one function per action, for an author who prefers that to writing `submit`:
 *
 *     const store = new Actions({ lookup: storeLookup, currentVersion: storeVersion })
 *       .action("store.copy_batch", async (opKey, input) => { … });
 *
 * An operation whose action has no function is answered `failed("invalid_params")`: nothing is sent.
 */
export class Actions implements Connector {
  private readonly sends = new Map<string, Send>();

  constructor(
    private readonly handlers: {
      readonly lookup: (opKey: string) => Answer<Outcome>;
      readonly currentVersion: (locator: string) => Answer<string>;
    },
  ) {}

  action(name: string, send: Send): this {
    this.sends.set(name, send);
    return this;
  }

  submit(opKey: string, request: OperationRequest): Answer<Outcome> {
    const send = this.sends.get(request.action);
    if (send === undefined) return failed("invalid_params", `no function for action '${request.action}'`);
    return send(opKey, request.input);
  }

  lookup(opKey: string): Answer<Outcome> {
    return this.handlers.lookup(opKey);
  }

  currentVersion(locator: string): Answer<string> {
    return this.handlers.currentVersion(locator);
  }
}
