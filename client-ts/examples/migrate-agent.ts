/**
 * The reference agent in TypeScript (examples/migrate_agent.py, ported): migrate a project into the object store
 * (harness/simulator.py speaks its API).
 *
 *     node dist/examples/migrate-agent.js --url http://127.0.0.1:8000 --token rk_… \
 *         --store http://127.0.0.1:8100 --project acme --objects 1200
 *
 * It plans (prepare the target, copy in batches sized by the store's transaction boundary, verify every digest,
 * switch the project's reference) and runs the plan with the client; leases, directives, op keys and reconciliation
 * are the client's. Each copy leaves a staging object its receipt names; once the task has ended, Reckon tells the
 * agent to delete each one (`delete`). Killed anywhere and started again with the same arguments, it finds its task
 * again (the create is keyed by project and source version) and finishes it without writing anything twice: the
 * client reconciles by op key before it sends anything new.
 */

import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import {
  ApiError,
  type Connector,
  type FailureClass,
  type OperationRequest,
  type Outcome,
  Reckon,
  RemoteUnreachable,
  type Task,
  accepted,
  committed,
  failed,
  fenced,
  notFound,
  unprovable,
} from "../src/index.js";

export const KIND = "migrate_project_api";

type Json = Readonly<Record<string, unknown>>;

/** A write's HTTP refusal → its failure class (as agents/objectstore.py). Anything else is unknown. */
const REFUSALS: Readonly<Record<number, FailureClass>> = {
  400: "invalid_params",
  422: "invalid_params",
  401: "permission_revoked",
  403: "permission_revoked",
  409: "conflict",
  429: "dependency_unavailable",
  503: "dependency_unavailable",
};

/** The project to migrate is not in the store (a typo, or a source never registered). */
export class SourceNotFound extends Error {}

interface Answered {
  readonly status: number;
  readonly body: Json;
  readonly text: string;
}

/** The connector: the store dedupes writes by op key and answers what became of one (`GET /ops/<op_key>`).
 * `trace` hears each call to the store (`submit <op key>`, `lookup …`, `fence …`, `delete …`). */
export class ObjectStore implements Connector {
  readonly url: string;

  constructor(
    url: string,
    private readonly timeout = 10,
    private readonly trace: (call: string, opKey: string) => void = () => {},
  ) {
    this.url = url.replace(/\/+$/, "");
  }

  async submit(opKey: string, request: OperationRequest): Promise<Outcome> {
    this.trace(request.action === "delete" ? "delete" : "submit", opKey);
    const body = { action: request.action.replace(/^store\./, ""), params: request.input };
    // The deadline Reckon gave the request: the store refuses it if it arrives later (a final not found).
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    if (request.not_after) headers["Reckon-Not-After"] = request.not_after;
    let response: Answered;
    try {
      response = await this.call("POST", `/ops/${encodeURIComponent(opKey)}`, JSON.stringify(body), headers);
    } catch (error) {
      if (refused(error)) return failed("dependency_unavailable", `not sent: ${String(error)}`); // never left
      return failed("connection_interrupted", String(error)); // sent, no answer: unknown until looked up
    }
    if (response.status === 200) return outcomeOf(response.body);
    if (response.status === 409 && response.body["error"] === "fenced") return fenced(); // refused for ever
    if (response.status === 409 && response.body["error"] === "deadline_passed") {
      // It took no effect; a store whose clock runs ahead by more than the deadline refuses every copy, so each one
      // is a retry on the budget, not a free re-send.
      return failed("dependency_unavailable", `HTTP 409 deadline_passed: ${response.text.slice(0, 200)}`);
    }
    const failure = REFUSALS[response.status] ?? (response.status < 500 ? "invalid_params" : "connection_interrupted");
    return failed(failure, `HTTP ${response.status}: ${response.text.slice(0, 200)}`);
  }

  /** Delete exactly the staging object `locator` (a temp resource a copy's receipt named) under `opKey`: Reckon
   * asks for it once the task has ended; the store dedupes the delete by op key like any write. */
  delete(opKey: string, locator: string): Promise<Outcome> {
    return this.submit(opKey, { action: "delete", input: { locator } });
  }

  async lookup(opKey: string): Promise<Outcome> {
    this.trace("lookup", opKey);
    let response: Answered;
    try {
      response = await this.call("GET", `/ops/${encodeURIComponent(opKey)}`);
    } catch (error) {
      return failed("connection_interrupted", `lookup failed: ${String(error)}`);
    }
    if (response.status === 200) return outcomeOf(response.body);
    if (response.status === 404) return notFound();
    if (response.status === 501) return unprovable("the object store cannot be queried by op key");
    return failed("connection_interrupted", `lookup failed: HTTP ${response.status}`);
  }

  /** What became of opKey, and if nothing, the store refuses it from now on (asked once a cancel is recorded: a
   * final answer, where a lookup's not found would wait for the request's deadline). */
  async fence(opKey: string): Promise<Outcome> {
    this.trace("fence", opKey);
    let response: Answered;
    try {
      response = await this.call("POST", `/fence/${encodeURIComponent(opKey)}`);
    } catch (error) {
      return failed("connection_interrupted", `fence failed: ${String(error)}`);
    }
    if (response.status === 200 && response.body["state"] === "fenced") return fenced();
    if (response.status === 200) return outcomeOf(response.body);
    if (response.status === 501) return this.lookup(opKey);
    return failed("connection_interrupted", `fence failed: HTTP ${response.status}`);
  }

  async currentVersion(locator: string): Promise<string> {
    return String((await this.source(locator))["version"]);
  }

  /** The source's version and digest now. RemoteUnreachable when the store cannot be asked: the client then ends
   * the run to try again later, having written nothing. */
  async source(locator: string): Promise<Json> {
    let response: Answered;
    try {
      response = await this.call("GET", `/versions/${encodeURIComponent(locator)}`);
    } catch (error) {
      throw new RemoteUnreachable(`version of ${locator}: ${String(error)}`, { cause: error });
    }
    if (response.status >= 500) throw new RemoteUnreachable(`version of ${locator}: HTTP ${response.status}`);
    if (response.status === 404) throw new SourceNotFound(`the store has no source '${locator}': nothing to migrate`);
    if (response.status !== 200) throw new Error(`version of ${locator}: HTTP ${response.status}`);
    return response.body;
  }

  async maxBatch(): Promise<number> {
    const response = await this.call("GET", "/limits");
    return Number(response.body["max_batch"]);
  }

  private async call(
    method: string,
    path: string,
    body?: string,
    headers: Record<string, string> = {},
  ): Promise<Answered> {
    const init: RequestInit = { method, headers, signal: AbortSignal.timeout(this.timeout * 1000) };
    if (body !== undefined) init.body = body;
    const response = await fetch(this.url + path, init);
    const text = await response.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    const answer = typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Json) : {};
    return { status: response.status, body: answer, text };
  }
}

/** A connection refused: the request never left, so nothing can have happened. */
function refused(error: unknown): boolean {
  const cause = error instanceof Error ? error.cause : undefined;
  return typeof cause === "object" && cause !== null && (cause as { code?: unknown }).code === "ECONNREFUSED";
}

export function outcomeOf(answer: Json): Outcome {
  const receipt = (answer["receipt"] ?? {}) as Json;
  if (answer["state"] === "accepted") return accepted(String(receipt["remote_id"] ?? ""));
  if (answer["state"] !== "committed") {
    return failed("connection_interrupted", `unexpected answer ${String(answer["state"])}`);
  }
  const count = receipt["count"];
  const temp = receipt["temp"];
  return committed(String(receipt["remote_id"] ?? ""), {
    remoteVersion: String(receipt["remote_version"] ?? ""),
    count: typeof count === "number" && Number.isInteger(count) ? count : null,
    digest: String(receipt["digest"] ?? ""),
    data: Array.isArray(temp) && temp.length > 0 ? { temp: temp.map(String) } : {},
  });
}

/** Prepare, copy in batches of at most `maxBatch` (the store's transaction boundary), verify, switch. The copies are
 * one fan-out node: Reckon makes it `copy-batch-1` … `copy-batch-n`, each with its batch's number and size. */
export function plan(project: string, objects: number, source: Json, maxBatch: number): Json {
  const ref = { ref: { ...source } };
  const target = { from: "prepare-target", field: "remote_id" };
  return {
    nodes: [
      {
        key: "prepare-target",
        action: "store.prepare_target",
        input: { project, source: ref },
        evidence: { remote_id: true },
      },
      {
        key: "copy-batch",
        action: "store.copy_batch",
        depends_on: ["prepare-target"],
        fan_out: { total: objects, batch: maxBatch },
        input: { target, source: ref, batch: { each: "index" }, limit: { each: "size" } },
        evidence: { remote_id: true, count: { input: "limit" } },
        on_failure: { dependency_unavailable: "retry" },
      },
      {
        key: "verify-digests",
        action: "store.verify_digests",
        depends_on: ["copy-batch"],
        input: { target, source: ref },
        evidence: { remote_id: true, count: objects, digest: { input: "source", field: "digest" } },
      },
      {
        key: "switch-reference",
        action: "store.switch_reference",
        depends_on: ["verify-digests"],
        input: { target, source: ref },
        evidence: { remote_id: true, remote_version: { input: "source", field: "version" } },
        irreversible: true,
        compensation: "store.restore_reference",
      },
    ],
  };
}

/** The task for this migration. The version migrated is the source's now, pinned in the plan; the create is keyed by
 * it, so an agent started again with the same arguments gets the same task back and resumes it. */
export async function create(
  reckon: Reckon,
  store: ObjectStore,
  project: string,
  objects: number,
  batch?: number,
): Promise<Task> {
  const locator = `projects/${project}`;
  const found = await store.source(locator);
  const source = { source: "store", locator, version: found["version"], digest: found["digest"] };
  const most = await store.maxBatch();
  if (batch !== undefined && !(batch >= 1 && batch <= most)) {
    throw new RangeError(`--batch ${batch}: the store copies 1 to ${most} objects in one transaction`);
  }
  const size = batch ?? most;
  const key = `migrate:${project}:${String(source.version)}:${objects}:${size}`;
  return reckon.createTask(KIND, `Migrate project ${project}`, plan(project, objects, source, size), {
    project,
    idempotencyKey: key,
  });
}

export async function main(argv: readonly string[]): Promise<number> {
  const { values } = parseArgs({
    args: [...argv],
    options: {
      url: { type: "string" },
      token: { type: "string" },
      store: { type: "string" },
      project: { type: "string" },
      objects: { type: "string" },
      batch: { type: "string" },
      task: { type: "string" },
      "lease-ttl": { type: "string" },
      "lease-wait": { type: "string", default: "60" },
      trace: { type: "boolean", default: false },
    },
  });
  const { url, token, project } = values;
  if (!url || !token || !values.store || !project || !values.objects) {
    console.error("usage: migrate-agent --url URL --token TOKEN --store URL --project NAME --objects N");
    return 2;
  }
  const trace = values.trace ? (call: string, opKey: string) => console.log(`${call} ${opKey}`) : undefined;
  const store = new ObjectStore(values.store, 10, trace);
  const reckon = new Reckon(url, token);
  let taskId: number;
  try {
    const batch = values.batch !== undefined ? Number(values.batch) : undefined;
    const objects = Number(values.objects);
    taskId = values.task ? Number(values.task) : (await create(reckon, store, project, objects, batch)).id;
  } catch (error) {
    if (error instanceof SourceNotFound || error instanceof RangeError) {
      console.error(error.message);
      return 2;
    }
    if (error instanceof ApiError) {
      // Nothing was created: say what Reckon said, and what to change.
      console.error(`Reckon refused the task: ${error.message}`);
      return 2;
    }
    throw error;
  }
  console.log(`task ${taskId}`);
  const ttlSeconds = values["lease-ttl"] !== undefined ? Number(values["lease-ttl"]) : undefined;
  const options = { leaseWait: Number(values["lease-wait"]), ...(ttlSeconds !== undefined ? { ttlSeconds } : {}) };
  try {
    for (;;) {
      const result = await reckon.run(taskId, store, options);
      if (result.until === null) {
        console.log(`task ${taskId}: ${result.status} ${result.reason}`.trimEnd());
        return result.done ? 0 : 1;
      }
      const until = result.until;
      console.log(`waiting (${result.reason}) until ${until.toISOString()}`);
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, until.getTime() - Date.now())));
    }
  } catch (error) {
    if (error instanceof ApiError) {
      // The task is as Reckon holds it: run the agent again with --task to resume.
      console.error(`task ${taskId}: Reckon refused a step: ${error.message}`);
      return 1;
    }
    throw error;
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  process.exitCode = await main(process.argv.slice(2));
}
