/**
 * kill -9: the reference agent (examples/migrate-agent.ts) as its own process is SIGKILLed while its second copy is
 * in the store's hands — Reckon registered the operation and marked it sent, the store has the request, no outcome
 * was posted. Started again with the same arguments, the next process finds its task (the create is keyed), waits
 * for the dead one's lease to lapse, asks the store what became of the copy in flight before it sends anything, and
 * finishes: every op key applied once, every object written once, by the store's own count.
 */

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { Reckon } from "../src/index.js";
import { type Json, live, nodeOf, sleep, source, uidOf } from "./live.js";

const AGENT = fileURLToPath(new URL("../examples/migrate-agent.js", import.meta.url));
const PROJECT = "ts-kill";

interface Agent {
  readonly process: ChildProcess;
  readonly lines: string[];
  readonly exited: Promise<number | null>;
}

function agent(url: string, token: string, store: string): Agent {
  const args = [AGENT, "--url", url, "--token", token, "--store", store, "--project", PROJECT];
  args.push("--objects", "1500", "--batch", "500", "--lease-ttl", "5", "--lease-wait", "30", "--trace");
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  const lines: string[] = [];
  let rest = "";
  const hear = (chunk: Buffer): void => {
    const text = rest + chunk.toString();
    const parts = text.split("\n");
    rest = parts.pop() ?? "";
    lines.push(...parts);
  };
  child.stdout?.on("data", hear);
  child.stderr?.on("data", hear);
  const exited = once(child, "exit").then(([code]) => code as number | null);
  return { process: child, lines, exited };
}

type Probe<T> = () => Promise<T | undefined> | T | undefined;

async function until<T>(what: string, seconds: number, probe: Probe<T>): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const found = await probe();
    if (found !== undefined) return found;
    assert.ok(Date.now() < deadline, `timed out: ${what}`);
    await sleep(50);
  }
}

test("an agent SIGKILLed with a write in the store's hands is finished by the next, each written once", async (t) => {
  const { url, token, store } = live();
  const agents: Agent[] = [];
  t.after(() => agents.forEach((a) => a.process.kill("SIGKILL"))); // none outlives a failed test
  await source(store, PROJECT);
  // The second copy waits 3 s in the store before it commits: the kill lands while the store holds the request.
  await store.fault("latency", { ms: 3000, action: "copy_batch", match: "-p1-copy-batch-2-" });
  const reckon = new Reckon(url, token);

  const first = agent(url, token, store.url);
  agents.push(first);
  const taskId = await until("the agent's task", 20, () => {
    const said = first.lines.find((line) => /^task \d+$/.test(line));
    return said ? Number(said.split(" ")[1]) : undefined;
  });
  const inFlight = await until("the second copy sent", 20, async () => {
    assert.equal(first.process.exitCode, null, first.lines.join("\n"));
    const open = ((await reckon.getTask(taskId)).raw["open_operations"] ?? []) as Json[];
    const copy = open.find((op) => op["node"] === "copy-batch-2" && op["status"] === "dispatched");
    return copy ? String(copy["op_key"]) : undefined;
  });
  await until("the store to have the request", 10, () =>
    first.lines.includes(`submit ${inFlight}`) ? true : undefined,
  );
  await sleep(300);
  first.process.kill("SIGKILL");
  assert.equal(await first.exited, null); // killed, not exited
  const uid = uidOf(inFlight);
  assert.equal((await store.effectsOf(uid))[inFlight], undefined, "the copy had not taken effect at the kill");
  const task = await reckon.getTask(taskId);
  assert.equal(task.status, "running");
  assert.ok(((task.raw["open_operations"] ?? []) as Json[]).some((op) => op["op_key"] === inFlight));

  // The same command again: it resumes the same task and reconciles the copy before anything else.
  const second = agent(url, token, store.url);
  agents.push(second);
  assert.equal(await second.exited, 0, second.lines.join("\n"));
  assert.ok(second.lines.includes(`task ${taskId}: done`), second.lines.join("\n"));
  const calls = second.lines.filter((line) => /^(submit|lookup|fence|delete) rk-/.test(line));
  assert.equal(calls[0], `lookup ${inFlight}`, "reconcile first: the copy in flight is looked up before any send");
  assert.ok(!calls.includes(`submit ${inFlight}`), "the copy in flight was never sent again");

  // The store's own count: every op key of the task applied once — prepare, three copies, verify, switch, and the
  // three staging objects' deletes — and the 1,500 objects in the target, no staging object left.
  const effects = await store.effectsOf(uid);
  assert.deepEqual(new Set(Object.values(effects)), new Set([1]), JSON.stringify(effects));
  assert.equal(Object.keys(effects).length, 9, JSON.stringify(effects));
  assert.deepEqual(Object.keys(effects).map(nodeOf).filter(Boolean).sort(), [
    "copy-batch-1",
    "copy-batch-2",
    "copy-batch-3",
    "prepare-target",
    "switch-reference",
    "verify-digests",
  ]);
  const objects = Object.keys(await store.objects()).filter((key) => key.startsWith(`tgt-${PROJECT}-`));
  assert.equal(objects.filter((key) => key.includes("/objects/")).length, 1500);
  assert.deepEqual(objects.filter((key) => key.includes("/tmp/")), []);
  assert.equal((await reckon.getTask(taskId)).status, "completed");
});
