"""webgguf: GGUF language models in the browser (Pyodide + WebGPU) and natively (CPython + wgpu)."""

__version__ = "0.1.0"
