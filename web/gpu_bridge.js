// The WebGPU half of webgguf.gpu.browser.BrowserBackend (its Python half runs in Pyodide).
//
// Python calls into this module a handful of times per operation, with plain arguments; everything
// that happens many times stays on this side of the bridge:
// - replay(): a plan arrives once as a flat JS array and is encoded here, one call per batch of
//   tokens, never one Python→JS call per dispatch;
// - upload(): weight bytes go from a byte source (fetch stream, File) straight into a GPU buffer
//   with queue.writeBuffer; they never enter the wasm heap.
//
// Values Python reads are `undefined` when absent (it becomes None; JS null would not).
//
// Errors: WebGPU reports validation / out-of-memory errors asynchronously. Every operation runs in
// error scopes labelled with its operation and object name; errors collect in `errors` and Python
// raises them (as GpuError) when a read it awaits resolves, or at `synchronize()`. Errors outside
// any scope arrive through `uncapturederror`; device loss through `device.lost`.

import { waitFor } from "./waits.js";

// Plan steps, flattened: STEP_SIZE slots per step.
export const STEP_SIZE = 6;
export const DISPATCH = 0; // [DISPATCH, pipeline, bindGroup, x, y, z]
export const COPY = 1; // [COPY, src, dst, size, srcOffset, dstOffset]

// A plan replayed once is submitted after this many dispatches, then after twice as many each time.
const FIRST_SUBMIT_DISPATCHES = 16;

// Bytes queued with writeBuffer between waits for the queue: bounds the copies the browser holds.
const UPLOAD_SYNC_BYTES = 64 << 20;

// WebGPU usage flags of the backend's buffer kinds (webgguf.gpu.base: STORAGE, UNIFORM, READBACK).
const usageFlags = (usage) =>
  ({
    storage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    uniform: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    readback: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  })[usage];

const camelCase = (name) => name.replace(/-([a-z])/g, (_, c) => c.toUpperCase());

// The adapter and a device with every limit at the adapter's value and the wanted optional features
// the adapter has. `onLost(message)` is called if the device is lost later.
export async function openDevice(wantedFeatures, limitNames, onLost) {
  if (!globalThis.navigator?.gpu) {
    throw new Error(
      "WebGPU is not available here (navigator.gpu is missing): use a browser with WebGPU, " +
        "on https:// or http://localhost",
    );
  }
  const request = navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  const adapter = await waitFor("GPU: requestAdapter", request);
  if (!adapter) throw new Error("WebGPU found no GPU adapter (is hardware acceleration off?)");
  const features = [...wantedFeatures].filter((f) => adapter.features.has(f));
  const requiredLimits = {};
  for (const name of limitNames) requiredLimits[camelCase(name)] = adapter.limits[camelCase(name)];
  const device = await waitFor(
    "GPU: requestDevice",
    adapter.requestDevice({ label: "webgguf", requiredFeatures: features, requiredLimits }),
  );
  return new GpuContext(adapter, device, features, requiredLimits, onLost);
}

export class GpuContext {
  constructor(adapter, device, features, limits, onLost) {
    const info = adapter.info;
    this.adapterName =
      [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ") || "WebGPU";
    this.features = features;
    this.limits = limits; // camelCase limit name → value the device was created with
    this.subgroupSizes = features.includes("subgroups") ? [info.subgroupMinSize, info.subgroupMaxSize] : undefined;
    this.fallbackAdapter = Boolean(info.isFallbackAdapter); // a CPU implementation, e.g. SwiftShader
    this.device = device;
    this.queue = device.queue;
    this.errors = []; // {operation, name, message} not yet raised in Python
    this.checks = new Set(); // error-scope pops not yet resolved
    this.lost = undefined; // the loss message once the device is lost
    this.released = false; // destroy() was called: the loss that follows is no failure
    this.uploadedSinceSync = 0;
    device.addEventListener("uncapturederror", (event) => {
      this.errors.push({ operation: "gpu", name: "", message: event.error.message });
    });
    device.lost.then((info) => {
      // Our own destroy() (a new device replaces this one) is not reported. Any other loss is, also
      // one with reason "destroyed": GPUDevice.destroy() called by other code of the page.
      if (this.released) return;
      this.lost = info.message || String(info.reason);
      this.errors.push({ operation: "device_lost", name: this.adapterName, message: this.lost });
      onLost?.(this.lost);
    });
  }

  // Run `fn` inside validation + out-of-memory error scopes; their errors are recorded as
  // `operation` on `name` when the scopes resolve.
  scoped(operation, name, fn) {
    this.device.pushErrorScope("out-of-memory");
    this.device.pushErrorScope("validation");
    try {
      return fn();
    } finally {
      const scopes = [this.device.popErrorScope(), this.device.popErrorScope()];
      const check = Promise.all(scopes)
        .then((errors) => {
          for (const error of errors) if (error) this.errors.push({ operation, name, message: error.message });
        })
        .catch((error) => this.errors.push({ operation, name, message: String(error?.message ?? error) }))
        .finally(() => this.checks.delete(check));
      this.checks.add(check);
    }
  }

  // Resolves once every error scope opened so far has reported.
  async settle() {
    while (this.checks.size) await waitFor("GPU: popErrorScope", Promise.all([...this.checks]));
  }

  // The errors recorded so far (as an array of [operation, name, message]); clears them.
  takeErrors() {
    const errors = this.errors.map((e) => [e.operation, e.name, e.message]);
    this.errors = [];
    return errors;
  }

  // Resolves after all work submitted so far has finished and its errors have been recorded.
  async synchronize() {
    if (!this.lost) await waitFor("GPU: onSubmittedWorkDone (synchronize)", this.queue.onSubmittedWorkDone());
    await this.settle();
  }

  destroy() {
    this.released = true;
    this.device.destroy();
  }

  // ---- buffers

  createBuffer(name, size, usage) {
    return this.scoped("create_buffer", name, () =>
      this.device.createBuffer({ label: name, size, usage: usageFlags(usage) }),
    );
  }

  // `data` is a PyProxy of a Python bytes-like object: its memory is read in place (no copy).
  writeBuffer(buffer, offset, data) {
    const view = data.getBuffer("u8");
    try {
      this.scoped("write_buffer", buffer.label, () => this.queue.writeBuffer(buffer, offset, view.data));
    } finally {
      view.release();
    }
  }

  destroyBuffer(buffer) {
    buffer.destroy();
  }

  // ---- kernels

  createPipeline(name, wgsl) {
    return this.scoped("create_pipeline", name, () => {
      const module = this.device.createShaderModule({ label: name, code: wgsl });
      return this.device.createComputePipeline({
        label: name,
        layout: "auto",
        compute: { module, entryPoint: "main" },
      });
    });
  }

  // entries: flat [binding, buffer, offset, size, ...]
  createBindGroup(name, pipeline, entries) {
    const list = [];
    for (let i = 0; i < entries.length; i += 4) {
      list.push({ binding: entries[i], resource: { buffer: entries[i + 1], offset: entries[i + 2], size: entries[i + 3] } });
    }
    return this.scoped("create_bind_group", `${name} for ${pipeline.label}`, () =>
      this.device.createBindGroup({ label: name, layout: pipeline.getBindGroupLayout(0), entries: list }),
    );
  }

  // ---- running

  // Encode `steps` (a flat plan, see STEP_SIZE) `repeat` times into one command encoder, compute
  // passes broken only by copies, and submit. Pipeline / bind group changes only when they differ.
  // A plan replayed once (a prompt chunk) is submitted in parts, its first FIRST_SUBMIT_DISPATCHES
  // dispatches, then twice as many each time, so that the GPU starts while the rest is encoded (as
  // webgguf.gpu.native does; decode batches, repeated, keep one submit).
  replay(name, steps, repeat) {
    this.scoped("replay", name, () => {
      let encoder = this.device.createCommandEncoder({ label: name });
      let pass = null;
      let pipeline = null;
      let group = null;
      let dispatched = 0;
      let submitAt = repeat === 1 ? FIRST_SUBMIT_DISPATCHES : -1;
      for (let r = 0; r < repeat; r++) {
        for (let i = 0; i < steps.length; i += STEP_SIZE) {
          if (steps[i] === COPY) {
            if (pass) pass.end();
            pass = null;
            encoder.copyBufferToBuffer(steps[i + 1], steps[i + 4], steps[i + 2], steps[i + 5], steps[i + 3]);
            continue;
          }
          if (dispatched === submitAt) {
            if (pass) pass.end();
            pass = null;
            this.queue.submit([encoder.finish()]);
            encoder = this.device.createCommandEncoder({ label: name });
            submitAt *= 2;
          }
          dispatched++;
          if (!pass) {
            pass = encoder.beginComputePass({ label: name });
            pipeline = group = null;
          }
          if (steps[i + 1] !== pipeline) pass.setPipeline((pipeline = steps[i + 1]));
          if (steps[i + 2] !== group) pass.setBindGroup(0, (group = steps[i + 2]));
          pass.dispatchWorkgroups(steps[i + 3], steps[i + 4], steps[i + 5]);
        }
      }
      if (pass) pass.end();
      this.queue.submit([encoder.finish()]);
    });
  }

  // Copy `size` bytes at `offset` of `buffer` to a mappable buffer and map it. Returns a PendingRead:
  // `done` turns true (and `promise` resolves) once `data` (a Uint8Array) or `error` is set and the
  // errors of all earlier work have been recorded.
  readAsync(buffer, offset, size) {
    const padded = Math.ceil(size / 4) * 4;
    const name = buffer.label;
    const read = { done: false, data: undefined, error: undefined, promise: undefined };
    const staging = this.scoped("read", name, () => {
      const staging = this.device.createBuffer({ label: `${name}.readback`, size: padded, usage: usageFlags("readback") });
      const encoder = this.device.createCommandEncoder({ label: `${name}.readback` });
      encoder.copyBufferToBuffer(buffer, offset, staging, 0, padded);
      this.queue.submit([encoder.finish()]);
      return staging;
    });
    read.promise = (async () => {
      try {
        await waitFor(`GPU: mapAsync of ${name}`, staging.mapAsync(GPUMapMode.READ));
        read.data = new Uint8Array(staging.getMappedRange(0, padded).slice(0, size));
        staging.unmap();
      } catch (error) {
        read.error = this.lost ? `the GPU device was lost: ${this.lost}` : String(error?.message ?? error);
      } finally {
        staging.destroy();
        await this.settle();
        read.done = true;
      }
    })();
    return read;
  }

  // ---- weights

  // Copy `size` bytes at `fileOffset` of `source` (a ByteSource: sources.js) into `buffer` at
  // `bufferOffset` (a multiple of 4). A tail that is not a multiple of 4 bytes is zero-padded, so
  // the buffer must have room for the padding.
  async upload(buffer, bufferOffset, source, fileOffset, size) {
    const writer = new AlignedWriter(this, buffer, bufferOffset);
    for await (const piece of source.pieces(fileOffset, size)) {
      writer.push(piece);
      this.uploadedSinceSync += piece.length;
      if (this.uploadedSinceSync >= UPLOAD_SYNC_BYTES) {
        this.uploadedSinceSync = 0;
        await waitFor("GPU: onSubmittedWorkDone (upload)", this.queue.onSubmittedWorkDone());
      }
    }
    writer.finish();
  }
}

// Writes consecutive pieces of bytes into a buffer. queue.writeBuffer needs offsets and sizes that
// are multiples of 4 and stream chunks end anywhere: up to 3 bytes are carried to the next piece.
class AlignedWriter {
  constructor(context, buffer, offset) {
    this.context = context;
    this.buffer = buffer;
    this.offset = offset; // where the next whole word goes
    this.carry = new Uint8Array(4);
    this.carried = 0;
  }

  push(bytes) {
    if (this.carried) {
      const take = Math.min(4 - this.carried, bytes.length);
      this.carry.set(bytes.subarray(0, take), this.carried);
      this.carried += take;
      bytes = bytes.subarray(take);
      if (this.carried < 4) return;
      this.write(this.carry);
      this.carried = 0;
    }
    const whole = bytes.length & ~3;
    if (whole) this.write(bytes.subarray(0, whole));
    this.carry.set(bytes.subarray(whole));
    this.carried = bytes.length - whole;
  }

  finish() {
    if (!this.carried) return;
    this.carry.fill(0, this.carried);
    this.write(this.carry);
    this.carried = 0;
  }

  write(bytes) {
    // writeBuffer copies `bytes` before it returns, so the carry array can be reused at once.
    this.context.scoped("upload", this.buffer.label, () =>
      this.context.queue.writeBuffer(this.buffer, this.offset, bytes),
    );
    this.offset += bytes.length;
  }
}
