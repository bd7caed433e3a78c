"""The GPU's streaming-read bandwidth, as a WGSL kernel sees it (shaders/stream_read.wgsl).

The yardstick for the decode GEMVs: a decode step reads every weight once, so its time is bounded below
by (weight bytes) / (this bandwidth). Reads buffers much larger than the caches, timed per dispatch with
timestamp queries (Backend.profile), median over the repeats.

    python tools/bench_bandwidth.py [--mib 1024] [--repeats 20] [--json]
"""

import argparse
import json
import statistics

from webgguf.gpu.base import STORAGE, Plan
from webgguf.gpu.native import NativeBackend
from webgguf.kernels import Kernels

WG = 256


def measure(backend, kernels: Kernels, n_bytes: int, workgroups: int, repeats: int) -> float:
    """Bytes per second of one pass over an n_bytes buffer with `workgroups` workgroups."""
    src = backend.create_buffer("stream_read.src", n_bytes, STORAGE)
    out = backend.create_buffer("stream_read.out", workgroups * WG * 4, STORAGE)
    kernel = kernels.get("stream_read", WG=WG)
    step = kernels.dispatch(
        kernel,
        "stream_read",
        workgroups,
        {"src": src, "out": out},
        n_vec4=n_bytes // 16,
        invocations=workgroups * WG,
    )
    times = [t.seconds for t in backend.profile(Plan("stream_read", (step,) * repeats))]
    backend.destroy_buffer(src)
    backend.destroy_buffer(out)
    return n_bytes / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="buffer size (clamped to one binding)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    backend = NativeBackend()
    kernels = Kernels(backend)
    limit = backend.limits.max_storage_buffer_binding_size
    n_bytes = min(args.mib << 20, limit // 16 * 16)
    results = {}
    for workgroups in (1024, 4096, 16384, 65535):
        results[workgroups] = measure(backend, kernels, n_bytes, workgroups, args.repeats)
    best = max(results.values())
    if args.json:
        print(
            json.dumps({"adapter": backend.adapter_name, "bytes": n_bytes, "best_gb_s": round(best / 1e9, 1)})
        )
        return
    print(f"adapter  {backend.adapter_name}; buffer {n_bytes / 2**20:.0f} MiB")
    for workgroups, rate in results.items():
        print(f"  {workgroups:6} workgroups x {WG}: {rate / 1e9:8.1f} GB/s")
    print(f"streaming read: {best / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
