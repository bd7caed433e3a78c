// The model cache: GGUF files downloaded by URL stay in the browser (the Origin Private File System),
// so a reload reads them from disk instead of the network.
//
// One entry per (URL, size, sha256 when the manifest gives one): `<id>.gguf` holds the bytes,
// `<id>.json` what is known about them (see newMeta). Bytes are handled in chunks of CHUNK bytes:
// - as a chunk arrives from the network, its SHA-256 (crypto.subtle) is recorded and it is written to
//   the file; the metadata is saved after each chunk, so `valid` (the bytes known good) survives a
//   closed tab and the next load resumes with an HTTP Range request from there;
// - a dropped connection is resumed within the same load (Range from the exact byte reached);
// - a chunk read back from the file is hashed again: a mismatch (a damaged file) re-fetches that one
//   chunk with a Range request, and checks it against the hash recorded when it first arrived;
// - with the manifest's sha256, the whole file is hashed as it arrives (the incremental SHA-256
//   below, its state saved with the metadata so a resumed download continues it) and checked at the end.
// Storage errors (a full quota: QuotaExceededError) never fail a load: the model then streams from
// the network, uncached, and the load result says why.
//
// The weights still never pass through Python: CachedSource is a byte source like those of
// sources.js (head(n) for the header, pieces(offset, size) for the GPU upload).
import { SourceError, StreamSource } from "./sources.js";
import { waitFor } from "./waits.js";

export const CHUNK = 4 << 20; // bytes per hashed chunk: the unit of resume and of repair
const DIR = "webgguf-models";
const MAX_RETRIES = 5; // reconnections per load without progress before giving up
const META_VERSION = 1;

// ---- the directory

const supported = () => typeof navigator !== "undefined" && !!navigator.storage?.getDirectory &&
  typeof FileSystemSyncAccessHandle !== "undefined";

// OPFS calls on a handle that stays referenced until they settle. Chromium (156 here) leaves the promise
// of an OPFS call pending for ever when the handle it was called on is garbage-collected meanwhile (as in
// `await (await dir.getFileHandle(name)).createSyncAccessHandle()`, whose file handle nothing references):
// a download then stopped at a random chunk, its metadata write never done. Measured with a 3-file model
// loaded by parallel downloads: 3 of 5 loads stalled so, and every load when gc() ran every 0.2 s; none
// with the handles held.
const inFlight = []; // handles with a call pending (a handle may be in it more than once)

// `what`: the name the call has in the worker's list of pending operations (waits.js).
async function held(handle, call, what = "cache: a file-system call") {
  inFlight.push(handle);
  try {
    return await waitFor(what, call(handle));
  } finally {
    inFlight.splice(inFlight.indexOf(handle), 1);
  }
}

// The sync access handle of file `name` in `dir` (the file created if missing).
async function openSyncHandle(dir, name) {
  const file = await held(dir, (d) => d.getFileHandle(name, { create: true }), "cache: getFileHandle");
  return held(file, (f) => f.createSyncAccessHandle(), "cache: createSyncAccessHandle");
}

async function directory() {
  const root = await navigator.storage.getDirectory();
  return held(root, (r) => r.getDirectoryHandle(DIR, { create: true }));
}

async function readMeta(dir, id) {
  try {
    const handle = await held(dir, (d) => d.getFileHandle(`${id}.json`));
    const file = await held(handle, (h) => h.getFile());
    const meta = JSON.parse(await file.text());
    return meta?.version === META_VERSION ? meta : null;
  } catch {
    return null; // missing or unreadable: treated as absent
  }
}

async function writeMeta(dir, meta) {
  const handle = await openSyncHandle(dir, `${meta.id}.json`);
  try {
    const bytes = new TextEncoder().encode(JSON.stringify(meta));
    handle.truncate(0);
    handle.write(bytes, { at: 0 });
    handle.flush();
  } finally {
    handle.close();
  }
}

async function removeEntry(dir, id) {
  for (const name of [`${id}.gguf`, `${id}.json`]) {
    try {
      await held(dir, (d) => d.removeEntry(name));
    } catch (error) {
      if (error.name !== "NotFoundError") throw error;
    }
  }
}

// Cached models: [{id, url, name, size, sha256, valid, complete, used}], most recently used first.
export async function listCached() {
  if (!supported()) return [];
  const dir = await directory();
  const out = [];
  for await (const [name] of dir.entries()) {
    if (!name.endsWith(".json")) continue;
    const meta = await readMeta(dir, name.slice(0, -5));
    if (!meta) continue;
    const { id, url, name: file, size, sha256, valid, complete, used } = meta;
    out.push({ id, url, name: file, size, sha256, valid, complete, used });
  }
  return out.sort((a, b) => b.used - a.used);
}

export async function deleteCached(id) {
  if (!/^[0-9a-f]{32}$/.test(String(id))) throw new SourceError(`no cached model ${id}`);
  try {
    await removeEntry(await directory(), id);
  } catch (error) {
    if (error.name === "NoModificationAllowedError" || error.name === "InvalidStateError") {
      throw new SourceError("the model is being loaded: delete it when the load has finished");
    }
    throw error;
  }
}

// Why a model is not cached after a storage error (a full quota above all), for the page.
function notCached(error) {
  const why =
    error.name === "QuotaExceededError"
      ? "the browser's storage for this site is full (QuotaExceededError)"
      : `writing the cache failed (${error.name}: ${error.message})`;
  return `Not cached: ${why}. It loads from the network; delete cached models to make room.`;
}

const hex = (buffer) => [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
const sha256Hex = async (bytes) => hex(await waitFor("cache: SHA-256", crypto.subtle.digest("SHA-256", bytes)));
const megabytes = (n) => `${(n / 1e6).toFixed(0)} MB`;

// ---- opening a URL

// A byte source for `url`: the cached entry, a resumed or new download into the cache, or (storage
// unavailable or full) a plain StreamSource. `expected`: {size, sha256} from the manifest, if any.
export async function openUrl(url, { signal, onBytes, onNote, expected = {} } = {}) {
  const uncached = async (why) => {
    onNote?.(why);
    const source = await StreamSource.open(url, { signal, onBytes });
    source.cacheInfo = () => ({ state: "off", message: why, network_bytes: source.loaded });
    return source;
  };
  if (!supported()) return uncached("Not cached: this browser has no Origin Private File System in workers.");
  let size = expected.size ?? null;
  const sha256 = expected.sha256 ?? null;
  const dir = await directory();
  if (size === null) {
    size = await remoteSize(url, signal);
    if (size === null) {
      // No size (no HEAD, or offline): a complete entry of this URL is still good to use.
      const known = (await listCached()).find((m) => m.url === url && m.complete);
      if (!known) return uncached("Not cached: the server did not say the file's size.");
      size = known.size;
    }
  }
  const id = (await sha256Hex(new TextEncoder().encode(`${url}\n${size}\n${sha256 ?? ""}`))).slice(0, 32);
  let meta = await readMeta(dir, id);
  if (!meta) {
    // A new entry: is there room? (the estimate covers every cached model of this origin)
    const { quota = Infinity, usage = 0 } = (await navigator.storage.estimate?.()) ?? {};
    if (quota - usage < size) {
      return uncached(
        `Not cached: the browser's storage for this site has ${megabytes(Math.max(0, quota - usage))} free ` +
          `and the model needs ${megabytes(size)} (QuotaExceededError). It loads from the network; ` +
          "delete cached models to make room.",
      );
    }
    meta = newMeta(id, url, size, sha256);
  }
  let handle;
  try {
    handle = await openSyncHandle(dir, `${id}.gguf`);
  } catch (error) {
    await removeEntry(dir, id).catch(() => {});
    return uncached(notCached(error));
  }
  const source = new CachedSource({ url, dir, meta, handle, signal, onBytes, onNote });
  try {
    if (handle.getSize() < meta.valid) source.restart(); // the file lost bytes: start over
    await source.save();
  } catch (error) {
    await source.discard(); // nothing of an entry that cannot be written stays behind
    return uncached(notCached(error));
  }
  if (meta.complete) onNote?.(`Reading ${meta.name} from the browser cache.`);
  else if (meta.valid) onNote?.(`Resuming the download of ${meta.name} at ${megabytes(meta.valid)}.`);
  return source;
}

function newMeta(id, url, size, sha256) {
  const name = decodeURIComponent(new URL(url).pathname.split("/").pop() || url);
  return {
    version: META_VERSION,
    id,
    url,
    name,
    size,
    sha256, // the manifest's, of the whole file, or null
    chunk: CHUNK,
    hashes: [], // SHA-256 (hex) of each chunk, recorded as it arrived
    valid: 0, // bytes [0, valid) are in the file and hashed (a multiple of chunk, or size)
    complete: false,
    file_hash_state: null, // Sha256 state after `valid` bytes (when sha256 is known)
    created: Date.now(),
    used: Date.now(),
  };
}

// The file's size from a HEAD request (no body); null if the server does not say or cannot be reached.
async function remoteSize(url, signal) {
  try {
    const response = await fetch(url, { method: "HEAD", signal });
    const length = response.headers.get("Content-Length");
    if (!response.ok || !length || response.headers.get("Content-Encoding")) return null;
    return Number(length);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    return null;
  }
}

// ---- the source

export class CachedSource {
  constructor({ url, dir, meta, handle, signal, onBytes, onNote }) {
    this.url = url;
    this.dir = dir;
    this.meta = meta;
    this.handle = handle; // FileSystemSyncAccessHandle of the data file (null once caching stopped)
    this.signal = signal;
    this.onBytes = onBytes;
    this.onNote = onNote;
    this.name = meta.name;
    this.size = meta.size;
    this.loaded = 0; // bytes handed out or passed so far (progress)
    this.caching = true; // false after a storage error: bytes then only stream through
    this.startedComplete = meta.complete;
    this.resumedAt = meta.complete ? 0 : meta.valid;
    this.networkBytes = 0; // bytes received from the network during this load
    this.repaired = []; // chunks found damaged and fetched again
    this.stoppedBecause = null; // why caching stopped, if it did
    this.removal = null; // the deletion of the entry once caching stopped (awaited before the load ends)
    this.kept = new Map(); // chunk index → bytes: header chunks, kept until the upload moves on
    this.last = null; // {index, bytes}: the chunk the upload reads now
    this.net = null; // {reader, at}: the network stream, positioned at byte `at`
    this.fileHash = meta.sha256 && !meta.complete ? Sha256.restore(meta.file_hash_state) : null;
    this.streamed = 0; // bytes received beyond `valid` when caching stopped
    this.readingHeader = true; // until pieces() is first called
  }

  chunkCount() {
    return Math.ceil(this.size / CHUNK);
  }

  chunkRange(index) {
    return [index * CHUNK, Math.min(this.size, (index + 1) * CHUNK)];
  }

  // A copy of bytes [0, n) (fewer if the file is shorter). The header's chunks stay in memory.
  async head(n) {
    n = Math.min(n, this.size);
    const out = new Uint8Array(n);
    for (let index = 0; index * CHUNK < n; index++) {
      const bytes = await this.chunk(index);
      this.kept.set(index, bytes);
      out.set(bytes.subarray(0, Math.min(bytes.length, n - index * CHUNK)), index * CHUNK);
    }
    return out;
  }

  // Bytes [offset, offset + size) as pieces (subarrays of whole chunks).
  async *pieces(offset, size) {
    this.readingHeader = false; // the upload has begun: pre-flight passed
    const end = offset + size;
    if (end > this.size) throw new SourceError(`${this.name} has ${this.size} bytes; a tensor needs bytes up to ${end}`);
    while (offset < end) {
      const index = Math.floor(offset / CHUNK);
      const bytes = await this.chunk(index);
      const from = offset - index * CHUNK;
      const to = Math.min(bytes.length, end - index * CHUNK);
      yield bytes.subarray(from, to);
      offset = index * CHUNK + to;
    }
  }

  // Chunk `index`: from memory, from the file (verified), or from the network (recorded).
  async chunk(index) {
    this.signal?.throwIfAborted();
    if (this.kept.has(index)) return this.kept.get(index);
    if (this.last?.index === index) return this.last.bytes;
    if (this.kept.size && index >= this.kept.size) this.kept.clear(); // the upload moved past the header
    let bytes;
    const [begin, end] = this.chunkRange(index);
    if (this.caching && end <= this.meta.valid) {
      bytes = await this.readStored(index);
    } else {
      // Streamed chunks come in order: any chunk skipped over is downloaded (and cached) first.
      while (this.nextNetworkChunk() < index) await this.fromNetwork(this.nextNetworkChunk());
      if (this.nextNetworkChunk() !== index) {
        throw new SourceError(`${this.name}: bytes at ${begin} were asked for after the download passed them`);
      }
      // The header's chunks come by bounded Range requests: if pre-flight then refuses the model,
      // no weight bytes are on their way (a streamed GET runs megabytes ahead of the reader).
      const bounded = this.readingHeader && !this.net;
      bytes = bounded ? await this.fromNetworkBounded(index) : await this.fromNetwork(index);
    }
    this.last = { index, bytes };
    this.loaded = Math.max(this.loaded, end);
    this.onBytes?.(this.loaded, this.size);
    return bytes;
  }

  nextNetworkChunk() {
    const at = this.caching ? this.meta.valid : this.streamed;
    return Math.ceil(at / CHUNK);
  }

  // A stored chunk, hashed again; a damaged one is fetched again with a Range request.
  async readStored(index) {
    const [begin, end] = this.chunkRange(index);
    const bytes = new Uint8Array(end - begin);
    const read = this.handle.read(bytes, { at: begin });
    const expected = this.meta.hashes[index];
    if (read === bytes.length && (await sha256Hex(bytes)) === expected) return bytes;
    const fresh = await this.fetchRange(begin, end);
    if ((await sha256Hex(fresh)) !== expected) {
      await this.discard();
      throw new SourceError(
        `${this.name}: the cached copy is damaged and the file at ${this.url} is no longer the one that ` +
          "was cached; the cache entry was deleted. Load the model again to download it anew.",
      );
    }
    this.write(fresh, begin);
    this.repaired.push(index);
    this.onNote?.(`Chunk ${index} of the cached ${this.name} was damaged; it was fetched again.`);
    return fresh;
  }

  // The next chunk from the network stream (opened, and reopened after a dropped connection, with Range).
  async fromNetwork(index) {
    const [begin, end] = this.chunkRange(index);
    const bytes = new Uint8Array(end - begin);
    let filled = 0;
    let retries = 0;
    while (filled < bytes.length) {
      const at = begin + filled;
      try {
        if (!this.net || this.net.at !== at) await this.openNetwork(at);
        let value = this.net.pending; // bytes of the previous read that belong to this chunk
        this.net.pending = null;
        if (!value) {
          const read = await waitFor(`network: read at byte ${at}`, this.net.reader.read());
          if (read.done) throw new SourceError(`the connection closed at byte ${at} of ${this.size}`);
          value = read.value;
          this.networkBytes += value.length;
        }
        const take = Math.min(value.length, bytes.length - filled);
        bytes.set(value.subarray(0, take), filled);
        filled += take;
        this.net.at += take; // the file offset of the next byte to consume
        if (take < value.length) this.net.pending = value.subarray(take);
        retries = 0;
      } catch (error) {
        if (error.name === "AbortError" || this.signal?.aborted) throw this.signal?.reason ?? error;
        if (error.fatal) throw error;
        if (++retries > MAX_RETRIES) {
          throw new SourceError(
            `the download of ${this.name} was interrupted at ${megabytes(at)} of ${megabytes(this.size)} ` +
              `(${error.message}); load it again to resume`,
          );
        }
        this.closeNetwork();
        await new Promise((resolve) => setTimeout(resolve, 200 * retries));
      }
    }
    await this.record(index, bytes);
    return bytes;
  }

  // A chunk by one Range request; a server without Range support gets the streamed GET instead.
  async fromNetworkBounded(index) {
    const [begin, end] = this.chunkRange(index);
    let response;
    try {
      const headers = { Range: `bytes=${begin}-${end - 1}` };
      response = await fetch(this.url, { signal: this.signal, headers, cache: "no-store" });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      return this.fromNetwork(index); // its retries and messages
    }
    if (response.status !== 206) {
      response.body?.cancel();
      return this.fromNetwork(index);
    }
    const bytes = new Uint8Array(await response.arrayBuffer());
    this.networkBytes += bytes.length;
    if (bytes.length !== end - begin) return this.fromNetwork(index);
    await this.record(index, bytes);
    return bytes;
  }

  // Opens the network stream at byte `at`: a plain GET at 0, a Range request past it.
  async openNetwork(at) {
    this.closeNetwork();
    const headers = at > 0 ? { Range: `bytes=${at}-` } : {};
    let response;
    try {
      const request = fetch(this.url, { signal: this.signal, headers, cache: "no-store" });
      response = await waitFor(`network: GET from byte ${at}`, request);
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new SourceError(`cannot fetch ${this.url}: ${error.message}`);
    }
    const fail = (message) => Object.assign(new SourceError(message), { fatal: true });
    if (!response.ok) throw fail(`cannot fetch ${this.url}: HTTP ${response.status} ${response.statusText}`.trim());
    const ranged = response.status === 206;
    const total = ranged
      ? Number(response.headers.get("Content-Range")?.split("/")[1])
      : Number(response.headers.get("Content-Length"));
    if (total && !response.headers.get("Content-Encoding") && total !== this.size) {
      response.body.cancel();
      throw fail(`${this.url} has ${total} bytes now, not the ${this.size} expected: it changed`);
    }
    const reader = response.body.getReader();
    let pending = null;
    if (at > 0 && !ranged) {
      // The server ignores Range: the whole file comes again; the bytes before `at` are skipped.
      for (let position = 0; position < at; ) {
        const { done, value } = await reader.read();
        if (done) throw new SourceError(`the connection closed at byte ${position} of ${this.size}`);
        this.networkBytes += value.length;
        if (position + value.length > at) pending = value.subarray(at - position);
        position += value.length;
      }
    }
    this.net = { reader, at, pending };
  }

  closeNetwork() {
    this.net?.reader.cancel().catch(() => {});
    this.net = null;
  }

  // Bytes of `length` at `begin` by one Range request (a damaged chunk).
  async fetchRange(begin, end) {
    let response;
    try {
      response = await fetch(this.url, { signal: this.signal, headers: { Range: `bytes=${begin}-${end - 1}` }, cache: "no-store" });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new SourceError(`cannot fetch ${this.url} to repair the cached copy: ${error.message}`);
    }
    if (response.status !== 206) {
      throw new SourceError(`cannot repair the cached ${this.name}: HTTP ${response.status} to a Range request`);
    }
    const bytes = new Uint8Array(await response.arrayBuffer());
    this.networkBytes += bytes.length;
    return bytes;
  }

  // A chunk that arrived: hashed, written, and the metadata saved (so a later load resumes after it).
  async record(index, bytes) {
    const [begin] = this.chunkRange(index);
    this.fileHash?.update(bytes);
    if (!this.caching) {
      this.streamed = begin + bytes.length;
      return;
    }
    this.meta.hashes[index] = await sha256Hex(bytes);
    this.meta.valid = begin + bytes.length;
    if (this.fileHash) this.meta.file_hash_state = this.fileHash.save();
    if (this.write(bytes, begin)) await this.save().catch((error) => this.stopCaching(error));
    await this.removal; // a storage error above: the partial entry is gone before the next chunk
  }

  // Writes into the cache file; false (and caching stopped) on a storage error such as a full quota.
  write(bytes, at) {
    if (!this.caching) return false;
    try {
      if (this.handle.write(bytes, { at }) !== bytes.length) throw new DOMException("short write", "QuotaExceededError");
      return true;
    } catch (error) {
      this.stopCaching(error);
      return false;
    }
  }

  // After a storage error: the bytes only stream through from here on, and the entry (its data file
  // and metadata) is deleted, so no later load trusts a partial file it could not finish.
  stopCaching(error) {
    if (!this.caching) return;
    this.caching = false;
    this.streamed = this.meta.valid;
    this.stoppedBecause = notCached(error);
    this.onNote?.(this.stoppedBecause);
    this.close();
    this.removal = removeEntry(this.dir, this.meta.id).catch((failure) => {
      this.stoppedBecause += ` (The partial entry could not be deleted: ${failure.message}.)`;
    });
  }

  restart() {
    Object.assign(this.meta, newMeta(this.meta.id, this.url, this.size, this.meta.sha256));
    this.fileHash = this.meta.sha256 ? new Sha256() : null;
    this.handle.truncate(0);
  }

  async save() {
    this.meta.used = Date.now();
    await writeMeta(this.dir, this.meta);
  }

  // After a successful load: download what the upload did not need (the entry is then complete),
  // check the manifest's sha256, and mark the entry complete.
  async finish() {
    await this.removal;
    while (this.nextNetworkChunk() < this.chunkCount()) await this.fromNetwork(this.nextNetworkChunk());
    if (this.fileHash) {
      const digest = this.fileHash.hex();
      if (digest !== this.meta.sha256) {
        await this.discard();
        throw new SourceError(
          `${this.name}: the downloaded bytes do not match the manifest's sha256 (${digest} instead of ` +
            `${this.meta.sha256}); the cache entry was deleted`,
        );
      }
    }
    if (this.caching) {
      this.meta.complete = this.meta.valid === this.size;
      this.meta.file_hash_state = null;
      await this.save().catch((error) => this.stopCaching(error));
    }
    await this.removal;
  }

  // Downloads the rest of the file into the cache ahead of the upload (a shard of a split model, fetched
  // while an earlier one uploads: sources.js SplitSource); its chunks are then read back from the file.
  // If caching stops on the way (a full quota), what it fetched went with the entry: reading then
  // streams the file again from its start.
  async download() {
    while (this.caching && this.nextNetworkChunk() < this.chunkCount()) {
      await this.fromNetwork(this.nextNetworkChunk());
    }
    this.closeNetwork();
    if (!this.caching) {
      this.streamed = 0;
      this.fileHash = this.meta.sha256 ? new Sha256() : null;
    }
  }

  // What happened, for the load result.
  cacheInfo() {
    const state = !this.caching
      ? "off"
      : this.startedComplete
        ? this.repaired.length
          ? "repaired"
          : "hit"
        : this.resumedAt
          ? "resumed"
          : "stored";
    const messages = {
      hit: `Loaded from the browser cache (${megabytes(this.size)}).`,
      repaired: `Loaded from the browser cache; ${this.repaired.length} damaged chunk(s) of ${megabytes(CHUNK)} were fetched again.`,
      resumed: `Download resumed at ${megabytes(this.resumedAt)}; the model is now cached.`,
      stored: "Downloaded; the model is now cached in this browser.",
      off: this.stoppedBecause,
    };
    return {
      state,
      message: messages[state],
      id: this.meta.id,
      network_bytes: this.networkBytes,
      repaired_chunks: this.repaired,
      resumed_at: this.resumedAt,
    };
  }

  // The load failed before this file was read (another file of a split model could not be opened):
  // an entry that holds nothing yet is forgotten, one with cached bytes kept.
  async abandon() {
    if (this.meta.valid === 0 && !this.meta.complete) await this.discard();
    else this.cancel();
  }

  // A failed load whose partial download is worth nothing (a bad file, a model that does not fit).
  async discard() {
    this.close();
    this.caching = false;
    await removeEntry(this.dir, this.meta.id).catch(() => {});
  }

  close() {
    try {
      this.handle?.close();
    } catch {
      // already closed
    }
    this.handle = null;
  }

  cancel() {
    this.closeNetwork();
    this.close();
    this.kept.clear();
    this.last = null;
  }
}

// ---- SHA-256, incremental (crypto.subtle only hashes whole buffers; a model can be gigabytes)

// Int32Array, not Uint32Array: values stay small integers for V8 (4x faster than doubles).
const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const INITIAL = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

export class Sha256 {
  constructor() {
    this.h = new Int32Array(INITIAL);
    this.w = new Int32Array(64);
    this.tail = new Uint8Array(64); // bytes of an unfinished block
    this.tailLength = 0;
    this.length = 0; // bytes hashed
  }

  // Continue from save()'s state (taken at a multiple of 64 bytes), or a fresh hash for null.
  static restore(state) {
    const hash = new Sha256();
    if (state) {
      hash.h.set(state.h);
      hash.length = state.length;
    }
    return hash;
  }

  save() {
    if (this.tailLength) throw new Error("Sha256.save needs a multiple of 64 bytes hashed");
    return { h: [...this.h], length: this.length }; // JSON: saved with the metadata
  }

  update(bytes) {
    this.length += bytes.length;
    let at = 0;
    if (this.tailLength) {
      const take = Math.min(64 - this.tailLength, bytes.length);
      this.tail.set(bytes.subarray(0, take), this.tailLength);
      this.tailLength += take;
      at = take;
      if (this.tailLength < 64) return;
      this.blocks(this.tail, 0, 64);
      this.tailLength = 0;
    }
    const whole = at + Math.floor((bytes.length - at) / 64) * 64;
    this.blocks(bytes, at, whole);
    this.tail.set(bytes.subarray(whole));
    this.tailLength = bytes.length - whole;
  }

  hex() {
    const bits = this.length * 8;
    const pad = new Uint8Array(((this.tailLength < 56 ? 56 : 120) - this.tailLength) + 8);
    pad[0] = 0x80;
    const view = new DataView(pad.buffer);
    view.setUint32(pad.length - 8, Math.floor(bits / 2 ** 32));
    view.setUint32(pad.length - 4, bits >>> 0);
    const length = this.length;
    this.update(pad);
    this.length = length;
    return [...this.h].map((x) => (x >>> 0).toString(16).padStart(8, "0")).join("");
  }

  blocks(bytes, begin, end) {
    const w = this.w;
    const h = this.h;
    for (let p = begin; p < end; p += 64) {
      for (let i = 0; i < 16; i++) {
        const q = p + 4 * i;
        w[i] = (bytes[q] << 24) | (bytes[q + 1] << 16) | (bytes[q + 2] << 8) | bytes[q + 3];
      }
      for (let i = 16; i < 64; i++) {
        const a = w[i - 15];
        const b = w[i - 2];
        const s0 = ((a >>> 7) | (a << 25)) ^ ((a >>> 18) | (a << 14)) ^ (a >>> 3);
        const s1 = ((b >>> 17) | (b << 15)) ^ ((b >>> 19) | (b << 13)) ^ (b >>> 10);
        w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
      }
      let a = h[0];
      let b = h[1];
      let c = h[2];
      let d = h[3];
      let e = h[4];
      let f = h[5];
      let g = h[6];
      let hh = h[7];
      for (let i = 0; i < 64; i++) {
        const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
        const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
        const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
        const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
        hh = g;
        g = f;
        f = e;
        e = (d + t1) | 0;
        d = c;
        c = b;
        b = a;
        a = (t1 + t2) | 0;
      }
      h[0] = (h[0] + a) | 0;
      h[1] = (h[1] + b) | 0;
      h[2] = (h[2] + c) | 0;
      h[3] = (h[3] + d) | 0;
      h[4] = (h[4] + e) | 0;
      h[5] = (h[5] + f) | 0;
      h[6] = (h[6] + g) | 0;
      h[7] = (h[7] + hh) | 0;
    }
  }
}
