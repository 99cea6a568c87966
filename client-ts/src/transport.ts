/**
 * What the driver needs to talk to Reckon: the base URL, the headers, and when and how long to back off.
 *
 * 429 (rate limited) and 503 (unavailable) are retried after `Retry-After` seconds (bounded, jittered); so are
 * transport errors (refused, reset, timed out). Retrying is safe because every write carries `If-Match` and an
 * `Idempotency-Key`: a write that did land answers its first response again, never a second change.
 */

import type { Reply } from "./protocol.js";

export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 503]);
export const MAX_ATTEMPTS = 8;
/** Seconds: a longer Retry-After is cut to this (the run holds a lease meanwhile). */
export const MAX_DELAY = 60;
export const USER_AGENT = "reckon-client-ts/0.1";

/** `http://host:8000` or `http://host:8000/api/v1` → the API's root. */
export function apiBase(url: string): string {
  const trimmed = url.replace(/\/+$/, "");
  return trimmed.endsWith("/api/v1") ? trimmed : `${trimmed}/api/v1`;
}

export function defaultHeaders(token: string): Record<string, string> {
  return { Authorization: `Bearer ${token}`, Accept: "application/json", "User-Agent": USER_AGENT };
}

/** Seconds to wait before attempt `attempt + 1`: the server's Retry-After when it gave one (in seconds), else
 * exponential from 0.25 s; capped at MAX_DELAY, plus up to 25 % jitter so that many agents do not come back
 * together. */
export function retryDelay(attempt: number, retryAfter?: string | null): number {
  let base = 0.25 * 2 ** attempt;
  const told = retryAfter ? Number(retryAfter) : Number.NaN;
  if (Number.isFinite(told)) base = Math.max(told, 0); // an HTTP date: our own backoff
  return Math.min(base, MAX_DELAY) * (1 + Math.random() / 4);
}

export function replyOf(status: number, headers: Headers, content: string): Reply {
  let body: unknown = null;
  if (content) {
    try {
      body = JSON.parse(content);
    } catch {
      body = { code: `http_${status}`, detail: content.slice(0, 200) };
    }
  }
  const named: Record<string, string> = {};
  headers.forEach((value, name) => {
    named[name.toLowerCase()] = value;
  });
  return { status, headers: named, body };
}
