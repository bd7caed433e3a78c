// web/gpu_bridge.js GpuContext.replay against a recording fake device (no browser, no GPU): what it
// encodes, in which order, and how it splits a plan into submits.
import assert from "node:assert/strict";
import { test } from "node:test";

import { COPY, DISPATCH, GpuContext, STEP_SIZE } from "../../web/gpu_bridge.js";

// A device whose encoders record their commands; queue.submit keeps the command buffers in order.
function recordingDevice() {
  const submits = [];
  const device = {
    queue: { submit: (buffers) => submits.push(...buffers.map((b) => b.commands)) },
    createCommandEncoder: () => {
      const commands = [];
      return {
        beginComputePass: () => {
          commands.push("begin");
          return {
            setPipeline: (p) => commands.push(`pipeline ${p}`),
            setBindGroup: (_, g) => commands.push(`group ${g}`),
            dispatchWorkgroups: (x) => commands.push(`dispatch ${x}`),
            end: () => commands.push("end"),
          };
        },
        copyBufferToBuffer: (src, _, dst) => commands.push(`copy ${src} ${dst}`),
        finish: () => ({ commands }),
      };
    },
    pushErrorScope: () => {},
    popErrorScope: () => Promise.resolve(null),
    addEventListener: () => {},
    lost: new Promise(() => {}),
  };
  return { context: new GpuContext({ info: {} }, device, [], {}, null), submits };
}

// n dispatches of one pipeline whose x counts them (0, 1, ...), a copy after every 10th.
function plan(n) {
  const steps = [];
  for (let i = 0; i < n; i++) {
    steps.push(DISPATCH, "p", "g", i, 1, 1);
    if (i % 10 === 9) steps.push(COPY, "a", "b", 4, 0, 0);
  }
  assert.equal(steps.length % STEP_SIZE, 0);
  return steps;
}

const dispatchesOf = (commands) => commands.filter((c) => c.startsWith("dispatch")).map((c) => Number(c.split(" ")[1]));

test("a plan replayed once is submitted after 16 dispatches, then after twice as many each time", async () => {
  const { context, submits } = recordingDevice();
  context.replay("prefill", plan(80), 1);
  await context.settle();
  assert.deepEqual(
    submits.map((commands) => dispatchesOf(commands).length),
    [16, 16, 32, 16],
  );
  // every dispatch once, in plan order, each submit's passes closed, the copies where the plan has them
  assert.deepEqual(dispatchesOf(submits.flat()), [...Array(80).keys()]);
  for (const commands of submits) {
    assert.equal(commands.filter((c) => c === "begin").length, commands.filter((c) => c === "end").length);
    assert.ok(commands.at(-1) === "end" || commands.at(-1).startsWith("copy"));
  }
  assert.equal(submits.flat().filter((c) => c.startsWith("copy")).length, 8);
  // a new pass (or submit) sets its pipeline and bind group again
  for (const commands of submits) assert.equal(commands[1], "pipeline p");
});

test("a repeated plan (decode steps) is one submit", async () => {
  const { context, submits } = recordingDevice();
  context.replay("decode", plan(40), 3);
  await context.settle();
  assert.equal(submits.length, 1);
  assert.deepEqual(dispatchesOf(submits[0]), [...[...Array(40).keys()], ...Array(40).keys(), ...Array(40).keys()]);
});
