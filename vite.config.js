// Vite builds the chat page (web/) into web/dist/. Run tools/build_web.py, which gathers the Pyodide
// runtime, the wheels and the shaders into web/public/ first (Vite copies public/ as it is).
//
// Entries: index.html (the chat page) and webgguf.js (the JS API, at a stable URL so other pages of
// the same origin can `import { createEngine } from "/webgguf.js"`). The worker is found by Vite
// through `new Worker(new URL("./worker.js", import.meta.url))` and bundled as an ES module.
import { resolve } from "node:path";
import { defineConfig } from "vite";

const root = resolve(import.meta.dirname, "web");

// Cross-origin isolation, as webgguf serve sends it, so the dev server behaves like the real one.
const isolation = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
};

export default defineConfig({
  root,
  publicDir: resolve(root, "public"),
  // `npm run dev` serves the page with hot reload; models come from `webgguf serve` (port 8000).
  server: { headers: isolation, host: "127.0.0.1", proxy: { "/models": "http://127.0.0.1:8000" } },
  preview: { headers: isolation, host: "127.0.0.1" },
  worker: { format: "es" },
  build: {
    outDir: resolve(root, "dist"),
    emptyOutDir: true,
    target: "es2022",
    rolldownOptions: {
      input: { index: resolve(root, "index.html"), webgguf: resolve(root, "webgguf.js") },
      preserveEntrySignatures: "exports-only",
      output: {
        entryFileNames: (chunk) => (chunk.name === "webgguf" ? "webgguf.js" : "assets/[name]-[hash].js"),
      },
    },
  },
});
