"""What the browser tests share: paths, the model, Chromium and its flags. A module of its own (not
conftest.py), so test modules import it by a name no other test directory uses: with several test
directories in one process (pytest-xdist workers take files from all of them), `conftest` is ambiguous."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "e2e"  # screenshots and measured timings (git-ignored)
MODEL = "smollm2-135m-instruct"
# SwiftShader is Chromium's CPU WebGPU; WebGPU exists only in a secure context (127.0.0.1 is one).
CHROMIUM_ARGS = [
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
