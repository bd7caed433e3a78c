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
