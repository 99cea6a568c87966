/**
 * What the live tests share: the server, token and store tests/test_client_ts.py started (environment variables),
 * the object store's control API (harness/simulator.py), a `fetch` that records — and may tamper with — every
 * exchange with Reckon, and the store's own count of side effects per op key.
 */

import { ObjectStore, plan } from "../examples/migrate-agent.js";

export type Json = Readonly<Record<string, unknown>>;

export interface Live {
  readonly url: string;
  readonly token: string;
  readonly store: StoreControl;
}

export function live(): Live {
  const need = (name: string): string => {
    const value = process.env[name];
    if (!value) throw new Error(`${name} is not set: run these tests through tests/test_client_ts.py`);
    return value;
  };
  return { url: need("RECKON_URL"), token: need("RECKON_TOKEN"), store: new StoreControl(need("RECKON_STORE_URL")) };
}

export const DIGEST = `sha256:${"ab".repeat(32)}`;

/** The source a test migrates, registered in the store at version 7; each test has a project of its own. */
export async function source(store: StoreControl, project: string): Promise<Json> {
  const locator = `projects/${project}`;
  await store.setSource(locator, "7", DIGEST);
  return { source: "store", locator, version: "7", digest: DIGEST };
}

/** The reference plan with every node key prefixed, so that the store's faults (`match` on the op key, which names
 * the node) reach one test's task only while the test files run side by side. */
export function keyedPlan(prefix: string, project: string, objects: number, from: Json, batch: number): Json {
  const nodes = (plan(project, objects, from, batch)["nodes"] as Json[]).map((node) => {
    const input = Object.fromEntries(
      Object.entries((node["input"] ?? {}) as Json).map(([name, value]) => {
        const ref = value as Json;
        return [name, typeof ref["from"] === "string" ? { ...ref, from: prefix + ref["from"] } : value];
      }),
    );
    const dependsOn = node["depends_on"] as string[] | undefined;
    return {
      ...node,
      key: prefix + String(node["key"]),
      input,
      ...(dependsOn ? { depends_on: dependsOn.map((key) => prefix + key) } : {}),
    };
  });
  return { nodes };
}

export interface StoreStats {
  readonly side_effects: number;
  readonly by_op_key: Readonly<Record<string, number>>;
  readonly by_action: Readonly<Record<string, number>>;
}

export interface FaultOptions {
  readonly times?: number;
  readonly ms?: number;
  readonly action?: string;
  readonly match?: string;
}

/** The simulator's control API (its `/_…` routes). */
export class StoreControl {
  constructor(readonly url: string) {}

  async control(path: string, body?: Json): Promise<Json> {
    const init: RequestInit = body
      ? { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } }
      : { method: "GET" };
    const response = await fetch(this.url + path, init);
    if (response.status !== 200) throw new Error(`store ${path}: HTTP ${response.status} ${await response.text()}`);
    return (await response.json()) as Json;
  }

  /** A fault for the next `times` requests it applies to (harness/simulator.py: `action`, `match`, `every`). */
  async fault(mode: string, options: FaultOptions = {}): Promise<void> {
    await this.control("/_faults", { mode, times: 1, ...options });
  }

  async setSource(locator: string, version: string, digest: string): Promise<void> {
    await this.control("/_sources", { locator, version, digest });
  }

  async stats(): Promise<StoreStats> {
    return (await this.control("/_stats")) as unknown as StoreStats;
  }

  async objects(): Promise<Readonly<Record<string, Json>>> {
    return (await this.control("/_state"))["objects"] as Record<string, Json>;
  }

  /** The side effects the store applied under each op key of one task (its uid is in every op key). */
  async effectsOf(uid: string): Promise<Record<string, number>> {
    const { by_op_key: counts } = await this.stats();
    return Object.fromEntries(Object.entries(counts).filter(([key]) => key.startsWith(`rk-${uid}-`)));
  }
}

/** The task's uid, as every op key of it carries: `rk-<uid>-p<plan>-<node>-<retry>` or `rk-<uid>-cleanup-…`. */
export function uidOf(opKey: string): string {
  const found = /^rk-([0-9a-f]{32})-/.exec(opKey);
  if (!found?.[1]) throw new Error(`not an op key: ${opKey}`);
  return found[1];
}

/** The node an effect's op key is for, or "" for a cleanup's. */
export function nodeOf(opKey: string): string {
  return /^rk-[0-9a-f]{32}-p\d+-(.+)-\d+$/.exec(opKey)?.[1] ?? "";
}

export interface StoreCall {
  readonly call: string;
  readonly opKey: string;
  readonly at: number;
}

/** The reference agent's connector, with a log of every call it made to the store. */
export function tracedStore(url: string): { connector: ObjectStore; calls: StoreCall[] } {
  const calls: StoreCall[] = [];
  const connector = new ObjectStore(url, 10, (call, opKey) => calls.push({ call, opKey, at: Date.now() }));
  return { connector, calls };
}

// ----------------------------------------------------------------------------------------- a fetch that watches

export interface Outgoing {
  readonly method: string;
  /** Under /api/v1. */
  readonly path: string;
  headers: Record<string, string>;
  body: unknown;
}

export interface Exchange {
  readonly request: Outgoing;
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly answer: unknown;
  readonly sentAt: number;
  readonly answeredAt: number;
  /** The status the client was shown instead (a test's `after` hook replaced the answer). */
  shown?: number;
}

export interface Hooks {
  /** Sees each request before it is sent; may change its headers or body (a tampered write). */
  readonly before?: (request: Outgoing) => void;
  /** Sees each answer; a Response it returns is what the client gets instead (an answer lost on the way). */
  readonly after?: (exchange: Exchange) => Response | undefined;
}

export function watch(hooks: Hooks = {}): { fetch: typeof fetch; log: Exchange[] } {
  const log: Exchange[] = [];
  const watching = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const sent = typeof init.body === "string" ? init.body : "";
    const request: Outgoing = {
      method: init.method ?? "GET",
      path: url.pathname.replace(/^\/api\/v1/, ""),
      headers: { ...(init.headers as Record<string, string>) },
      body: sent ? (JSON.parse(sent) as unknown) : null,
    };
    hooks.before?.(request);
    const sentAt = Date.now();
    const body = request.body === null ? null : JSON.stringify(request.body);
    const response = await fetch(url, { ...init, headers: request.headers, body });
    const text = await response.text();
    const headers: Record<string, string> = {};
    response.headers.forEach((value, name) => {
      headers[name] = value;
    });
    const exchange: Exchange = {
      request,
      status: response.status,
      headers,
      answer: text ? (JSON.parse(text) as unknown) : null,
      sentAt,
      answeredAt: Date.now(),
    };
    log.push(exchange);
    const instead = hooks.after?.(exchange);
    if (instead) {
      exchange.shown = instead.status;
      return instead;
    }
    return new Response(text === "" ? null : text, { status: response.status, headers: response.headers });
  };
  return { fetch: watching, log };
}

/** `POST /tasks/7/operations/…/outcome` → `POST outcome`: what a request was, for a readable sequence. */
export function named(request: Outgoing): string {
  const path = request.path.replace(/^\/tasks\/\d+/, "");
  if (path === "") return `${request.method} task`;
  if (/^\/operations\/[^/]+\/outcome$/.test(path)) return `${request.method} outcome`;
  if (/^\/temp-resources\/\d+\/cleanup$/.test(path)) return `${request.method} cleanup`;
  return `${request.method} ${path.slice(1)}`;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
