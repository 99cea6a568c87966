/**
 * The API's refusals as one error: every error Reckon answers is problem+json with a stable `code`.
 */

export type Problem = Readonly<Record<string, unknown>>;

/**
 * Reckon refused a request (nothing was changed). `code` is stable (docs/api.md's table); `problem` is the whole
 * RFC 9457 body (`current_version` on a 412, `errors` on a 422, …).
 */
export class ApiError extends Error {
  override readonly name = "ApiError";

  constructor(
    readonly status: number,
    readonly code: string,
    readonly detail: string = "",
    readonly problem: Problem = {},
  ) {
    super(detail ? `${status} ${code}: ${detail}` : `${status} ${code}`);
  }

  static of(status: number, body: unknown): ApiError {
    const problem = isObject(body) ? body : {};
    const code = typeof problem["code"] === "string" && problem["code"] ? problem["code"] : `http_${status}`;
    const detail = typeof problem["detail"] === "string" ? problem["detail"] : "";
    return new ApiError(status, code, detail, problem);
  }
}

/**
 * The connector could not reach its remote (the counterpart of Python's `OSError`): thrown by a connector's
 * `lookup`, `fence` or `currentVersion`, the run ends as `waiting` (`remote_unreachable`) having written nothing.
 */
export class RemoteUnreachable extends Error {
  override readonly name = "RemoteUnreachable";
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Reckon could not be reached (refused, reset, timed out) after every retry; what the request was is the message,
 * what failed is the `cause`. */
export class TransportError extends Error {
  override readonly name = "TransportError";
}
