"""What Chromium's WebGPU adapter offers on this machine: its features, subgroup sizes and, where it has
`chromium-experimental-subgroup-matrix` (tensor cores, behind --enable-unsafe-webgpu), its subgroup-matrix
configurations and whether a shader multiplying one int8 and one f16 tile of the first such
configuration compiles. One JSON object on stdout.

The engine does not use subgroup matrices yet; this is the yardstick for a GEMM that would (docs/PERF.md
"Tensor cores in the page"). tools/device_browser.sh runs it on the lent NVIDIA machine (stage
`adapter`); with --swiftshader it runs headless on SwiftShader, as the tests do.

Usage: python tools/page_adapter.py --chromium PATH [--swiftshader]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from page_bench import COMMON_FLAGS, GPU_FLAGS, SWIFTSHADER_FLAGS, stop_browser

# The page: adapter facts, then one compile per component type (WGSL built from the adapter's own
# configuration: left is K x M, right N x K, result N x M in WGSL's column, row order).
PAGE = r"""<!doctype html><script type="module">
const out = {};
try {
  const adapter = await navigator.gpu.requestAdapter({powerPreference: 'high-performance'});
  const info = adapter.info;
  out.features = [...adapter.features].sort();
  out.vendor = info.vendor;
  out.subgroup_sizes = [info.subgroupMinSize, info.subgroupMaxSize];
  const configs = [...(info.subgroupMatrixConfigs || [])].map(c => (
    {component: c.componentType, result: c.resultComponentType, M: c.M, N: c.N, K: c.K}));
  out.subgroup_matrix_configs = configs;
  if (adapter.features.has('chromium-experimental-subgroup-matrix')) {
    const device = await adapter.requestDevice({requiredFeatures: ['chromium-experimental-subgroup-matrix',
      ...(adapter.features.has('shader-f16') ? ['shader-f16'] : [])]});
    out.compiles = {};
    for (const type of ['i8', 'f16']) {
      const c = configs.find(c => c.component === type);
      if (!c) continue;
      const store = type === 'i8' ? 'i32' : 'f16';
      const code = `${type === 'f16' ? 'enable f16;' : ''} enable chromium_experimental_subgroup_matrix;
@group(0) @binding(0) var<storage, read_write> a: array<${type === 'i8' ? 'i32' : 'f16'}>;
@group(0) @binding(1) var<storage, read_write> r: array<${store}>;
@compute @workgroup_size(32) fn main() {
  let x = subgroupMatrixLoad<subgroup_matrix_left<${type}, ${c.K}, ${c.M}>>(&a, 0, false, ${c.K});
  let y = subgroupMatrixLoad<subgroup_matrix_right<${type}, ${c.N}, ${c.K}>>(&a, 0, false, ${c.N});
  var z = subgroup_matrix_result<${c.result}, ${c.N}, ${c.M}>();
  z = subgroupMatrixMultiplyAccumulate(x, y, z);
  subgroupMatrixStore(&r, 0, z, false, ${c.N});
}`;
      device.pushErrorScope('validation');
      const module = device.createShaderModule({code});
      const messages = (await module.getCompilationInfo()).messages;
      const error = await device.popErrorScope();
      out.compiles[`${type} ${c.M}x${c.N}x${c.K} -> ${c.result}`] = error ? 'error: ' + error.message
        : messages.filter(m => m.type === 'error').length ? 'error' : 'compiles';
    }
  }
} catch (e) {
  out.error = String(e);
}
await fetch('/result', {method: 'POST', body: JSON.stringify(out)});
</script>"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--swiftshader", action="store_true")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds to wait for the page")
    args = parser.parse_args()
    result: dict = {}
    done = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(PAGE.encode())

        def do_POST(self) -> None:
            result.update(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()
            done.set()

        def log_message(self, *_) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = tempfile.mkdtemp(prefix="webgguf-adapter-")
    flags = SWIFTSHADER_FLAGS if args.swiftshader else GPU_FLAGS
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = subprocess.Popen(
        [args.chromium, *COMMON_FLAGS, *flags, f"--user-data-dir={profile}", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not done.wait(args.limit):
            sys.exit(f"page_adapter: no answer from the page in {args.limit:.0f} s")
        print(json.dumps(result, indent=1))
    finally:
        stop_browser(browser)
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
