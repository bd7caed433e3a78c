// Byte sources: where the bytes of a GGUF file come from in the worker (a URL or a File).
//
// Python reads the header through head(n) (a copy of the first n bytes: the header is what Python
// needs in its heap anyway); the weight upload reads the tensors through pieces(offset, size), an
// async iterator of Uint8Array pieces that gpu_bridge.js writes straight into GPU buffers.
// A URL is read as one stream, front to back, so the upload must ask for ranges in file order;
// a File can be read anywhere. A URL loaded by the page goes through the model cache instead
// (web/cache.js: CachedSource, the same interface); StreamSource remains for when nothing is cached.

const BLOB_PIECE = 8 << 20; // bytes read from a File at a time

export class SourceError extends Error {
  name = "SourceError";
}

// A model from a URL: one GET, its body streamed. `onBytes(loaded, size)` reports progress.
export class StreamSource {
  static async open(url, { signal, onBytes } = {}) {
    let response;
    try {
      response = await fetch(url, { signal });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new SourceError(`cannot fetch ${url}: ${error.message}`);
    }
    if (!response.ok) {
      throw new SourceError(`cannot fetch ${url}: HTTP ${response.status} ${response.statusText}`.trim());
    }
    // Content-Length is the file size unless the body is compressed in transit.
    const length = response.headers.get("Content-Length");
    const size = length && !response.headers.get("Content-Encoding") ? Number(length) : null;
    const name = decodeURIComponent(new URL(response.url || url).pathname.split("/").pop() || url);
    return new StreamSource(name, size, response.body.getReader(), onBytes);
  }

  constructor(name, size, reader, onBytes) {
    this.name = name;
    this.size = size; // bytes, or null when the server did not say
    this.loaded = 0; // bytes received so far
    this.reader = reader;
    this.onBytes = onBytes;
    this.chunks = []; // received, not yet consumed; chunks[0] starts at file offset this.start
    this.start = 0;
    this.buffered = 0; // bytes in this.chunks
  }

  // Receive one more chunk; false at the end of the body.
  async more() {
    const { done, value } = await this.reader.read();
    if (done) return false;
    this.chunks.push(value);
    this.buffered += value.length;
    this.loaded += value.length;
    this.onBytes?.(this.loaded, this.size);
    return true;
  }

  // A copy of bytes [0, n) (fewer if the file is shorter). Only before pieces() has moved on.
  async head(n) {
    if (this.start !== 0) throw new SourceError("the header can only be read before the tensor data");
    while (this.buffered < n && (await this.more()));
    const out = new Uint8Array(Math.min(n, this.buffered));
    let at = 0;
    for (const chunk of this.chunks) {
      if (at === out.length) break;
      const part = chunk.subarray(0, out.length - at);
      out.set(part, at);
      at += part.length;
    }
    return out;
  }

  // Bytes [offset, offset + size) as pieces, consuming the stream up to their end.
  async *pieces(offset, size) {
    if (offset < this.start) {
      throw new SourceError(
        `${this.name}: bytes at ${offset} were asked for after the stream passed ${this.start} ` +
          "(a streamed file is read front to back)",
      );
    }
    const end = offset + size;
    while (offset < end) {
      if (!this.chunks.length && !(await this.more())) {
        throw new SourceError(`${this.name} ended at ${this.start} bytes; a tensor needs bytes up to ${end}`);
      }
      const chunk = this.chunks[0];
      const from = offset - this.start; // may be past this chunk: then it is skipped whole
      const to = Math.min(chunk.length, end - this.start);
      if (from < to) {
        yield chunk.subarray(from, to);
        offset = this.start + to;
      }
      if (to === chunk.length || from >= chunk.length) {
        this.chunks.shift();
        this.start += chunk.length;
        this.buffered -= chunk.length;
      }
    }
  }

  cancel() {
    this.reader.cancel().catch(() => {});
  }
}

// A model from a File (file picker, drag and drop) or any Blob: read where asked.
export class BlobSource {
  constructor(blob, { signal, onBytes } = {}) {
    this.name = blob.name || "model.gguf";
    this.size = blob.size;
    this.loaded = 0;
    this.blob = blob;
    this.signal = signal;
    this.onBytes = onBytes;
  }

  async read(begin, end) {
    this.signal?.throwIfAborted();
    const bytes = new Uint8Array(await this.blob.slice(begin, end).arrayBuffer());
    this.loaded = Math.max(this.loaded, end);
    this.onBytes?.(this.loaded, this.size);
    return bytes;
  }

  async head(n) {
    return this.read(0, Math.min(n, this.size));
  }

  async *pieces(offset, size) {
    const end = offset + size;
    if (end > this.size) throw new SourceError(`${this.name} has ${this.size} bytes; a tensor needs bytes up to ${end}`);
    for (let at = offset; at < end; at += BLOB_PIECE) yield await this.read(at, Math.min(end, at + BLOB_PIECE));
  }

  cancel() {}
}

// Shards of a split model downloaded at once: the one being uploaded and the next ones, fetched ahead
// into the cache (as wllama does; a CDN serves each connection at a limited rate).
export const PARALLEL_DOWNLOADS = 3;

// A split model (llama.cpp's gguf-split; web/worker.py has Python decide the files and merge their
// headers, py/webgguf/gguf_split.py): one byte sequence, its shards laid end to end in the order given.
// Python reads each shard's header through `shards[i].head(n)`; the upload reads tensors through
// pieces(offset, size) at offsets of that sequence (a tensor lies within one shard).
// When the upload reaches a shard, the next PARALLEL_DOWNLOADS - 1 shards that can be (cached sources:
// download()) are downloaded into the cache meanwhile, each with its own Range requests.
export class SplitSource {
  // `openShard(index, {onBytes, signal})` opens file `index`; `onBytes(loaded, total)` gets the bytes
  // of all files. A file that fails to open closes those opened before it (cache.js abandon()).
  static async open(count, openShard, { onBytes, signal, parallel = PARALLEL_DOWNLOADS } = {}) {
    const controller = new AbortController(); // stops downloads ahead when the source is cancelled
    const shardSignal = signal ? AbortSignal.any([signal, controller.signal]) : controller.signal;
    const shards = [];
    const loaded = new Array(count).fill(0);
    const report = (index) => (bytes) => {
      loaded[index] = bytes;
      const total = shards.length === count ? shards.reduce((sum, s) => sum + (s.size ?? 0), 0) : null;
      onBytes?.(loaded.reduce((a, b) => a + b, 0), total);
    };
    try {
      for (let index = 0; index < count; index++) {
        shards.push(await openShard(index, { onBytes: report(index), signal: shardSignal }));
      }
    } catch (error) {
      for (const shard of shards) await (shard.abandon?.() ?? shard.cancel());
      throw error;
    }
    return new SplitSource(shards, { controller, parallel });
  }

  constructor(shards, { controller = new AbortController(), parallel = PARALLEL_DOWNLOADS } = {}) {
    const unknown = shards.find((shard) => shard.size === null || shard.size === undefined);
    if (unknown) {
      throw new SourceError(`the server did not say the size of ${unknown.name}; a split model needs every file's size`);
    }
    this.shards = shards;
    this.name = shards[0].name;
    this.size = shards.reduce((sum, shard) => sum + shard.size, 0);
    this.bases = shards.map((_, index) => shards.slice(0, index).reduce((sum, shard) => sum + shard.size, 0));
    this.controller = controller;
    this.parallel = Math.max(1, parallel);
    this.downloads = new Map(); // shard index → promise of its download ahead
    this.reading = -1; // the shard the upload reads now
  }

  get loaded() {
    return this.shards.reduce((sum, shard) => sum + shard.loaded, 0);
  }

  // Bytes [offset, offset + size) of the sequence, from the shard that holds them.
  async *pieces(offset, size) {
    const index = this.bases.findLastIndex((base) => base <= offset);
    const shard = this.shards[index];
    const local = offset - this.bases[index];
    if (local + size > shard.size) {
      throw new SourceError(`bytes [${offset}, ${offset + size}) run past the end of ${shard.name}`);
    }
    if (index !== this.reading) {
      this.reading = index;
      this.downloadAhead(index);
      await this.downloads.get(index); // downloaded ahead: its chunks are read back from the cache
    }
    yield* shard.pieces(local, size);
  }

  // Starts the downloads of the shards after `index` that fit in the window of parallel connections.
  downloadAhead(index) {
    for (let next = index + 1; next < Math.min(this.shards.length, index + this.parallel); next++) {
      const shard = this.shards[next];
      if (this.downloads.has(next) || typeof shard.download !== "function") continue;
      const download = shard.download();
      download.catch(() => {}); // awaited when the upload reaches the shard, or by finish()
      this.downloads.set(next, download);
    }
  }

  // After a successful load: every shard's finish() (cache entries completed and checked).
  async finish() {
    for (const download of this.downloads.values()) await download;
    for (const shard of this.shards) await shard.finish?.();
  }

  // What the caches did, for the load result: the state of the shard that says most, and each shard's.
  cacheInfo() {
    const infos = this.shards.map((shard) => shard.cacheInfo?.() ?? null);
    if (infos.includes(null)) return null;
    const order = ["off", "repaired", "resumed", "stored", "hit"];
    const first = infos.reduce((a, b) => (order.indexOf(b.state) < order.indexOf(a.state) ? b : a));
    const count = (state) => infos.filter((info) => info.state === state).length;
    const summary = order.filter(count).map((state) => `${count(state)} ${state}`).join(", ");
    return {
      state: first.state,
      message: `${first.message} (${this.shards.length} files: ${summary})`,
      network_bytes: infos.reduce((sum, info) => sum + info.network_bytes, 0),
      shards: infos,
    };
  }

  async discard() {
    for (const shard of this.shards) await shard.discard?.();
  }

  cancel() {
    this.controller.abort(new DOMException("the load ended", "AbortError"));
    for (const shard of this.shards) shard.cancel();
  }
}
