// What the worker is waiting for: every await of a load or a generation that depends on something
// outside the worker (the GPU, the network, the file system of the model cache) is registered here
// while it is pending, with what it is and since when.
//
// The worker answers `stats` at once, whatever else runs, with these waits: a load that makes no
// progress says what it waits on (an onSubmittedWorkDone of the GPU, a read of the network stream,
// an Origin Private File System call) instead of showing "Loading…" for ever.

const pending = new Map(); // id → {what, since}
let nextId = 0;

// Resolves / rejects as `promise` does; meanwhile `what` is listed by pendingWaits().
export async function waitFor(what, promise) {
  const id = nextId++;
  pending.set(id, { what, since: performance.now() });
  try {
    return await promise;
  } finally {
    pending.delete(id);
  }
}

// [{what, seconds}] of the waits pending now, the oldest first.
export function pendingWaits() {
  const now = performance.now();
  return [...pending.values()].map(({ what, since }) => ({ what, seconds: (now - since) / 1000 }));
}
