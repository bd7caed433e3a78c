// Vite builds the chat page (web/) into web/dist/. Run tools/build_web.py, which gathers the Pyodide
// runtime, the wheels and the shaders into web/public/ first (Vite copies public/ as it is).
//
// Entries: index.html (the chat page), webgguf.js (the JS API, at a stable URL so other pages can
// `import { createEngine } from "https://host/webgguf.js"`) and embed.js (the chat widget of any page,
// `<script src="https://host/embed.js" data-model=... defer>`, also at a stable URL). The worker is
// found by Vite through `import workerUrl from "./worker.js?worker&url"` and bundled as an ES module.
//
// embed.js is loaded as a classic script (the one-line tag has no type="module"): it has no static
// import and no import.meta, so its ES-format output is also a valid classic script; it reaches the
// engine by a dynamic import() of /webgguf.js. tests/e2e/test_embed.py loads the built file with
// exactly that tag, from a page of another origin.
import { resolve } from "node:path";
import { defineConfig } from "vite";

const root = resolve(import.meta.dirname, "web");

// Cross-origin isolation, as webgguf serve sends it, so the dev server behaves like the real one;
// CORP cross-origin as webgguf serve sends it, for pages of other origins loading /embed.js (Vite's
// default CORS admits localhost / 127.0.0.1 origins; embedding from the dev server is not tested).
const isolation = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
  "Cross-Origin-Resource-Policy": "cross-origin",
};

// Entries served at a fixed URL (other pages name them), not a hashed one.
const stableNames = new Set(["webgguf", "embed"]);

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
      input: {
        index: resolve(root, "index.html"),
        webgguf: resolve(root, "webgguf.js"),
        embed: resolve(root, "embed.js"),
      },
      preserveEntrySignatures: "exports-only",
      output: {
        entryFileNames: (chunk) => (stableNames.has(chunk.name) ? `${chunk.name}.js` : "assets/[name]-[hash].js"),
      },
    },
  },
});
