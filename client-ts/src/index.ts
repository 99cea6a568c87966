/**
 * Reckon's TypeScript client: drive Reckon tasks from an agent over the REST API (docs/api.md).
 *
 *     import { Reckon, committed } from "reckon-client";
 *
 *     const reckon = new Reckon("http://127.0.0.1:8000", token);
 *     const task = await reckon.createTask("migrate_project_api", "Migrate acme", plan, { project: "acme" });
 *     const result = await reckon.run(task.id, connector);   // done / stopped (reason) / waiting (until)
 *
 * The author writes the plan and a connector (`submit` / `lookup` / `currentVersion`); leases, directives, op keys,
 * If-Match and reconciliation are the client's. No dependency beyond the platform's `fetch`.
 */

export { Reckon, type ReckonOptions, type RunOptions } from "./client.js";
export { Actions, type Answer, type Connector, type Send } from "./connector.js";
export { ApiError, type Problem, RemoteUnreachable, TransportError } from "./errors.js";
export {
  type Accepted,
  type Committed,
  type Failed,
  type FailureClass,
  type Fenced,
  type NotFound,
  type Outcome,
  type Receipt,
  type Unprovable,
  FAILURE_CLASSES,
  accepted,
  committed,
  failed,
  fenced,
  notFound,
  outcomeJson,
  unprovable,
} from "./outcomes.js";
export {
  type Content,
  type CreateOptions,
  type NodeReceipt,
  type OperationRequest,
  type Retained,
  type RetainOptions,
  type RunResult,
  type Task,
  RetainedRef,
} from "./protocol.js";
