#!/bin/bash
# The scale ladder on a lent GPU machine: webgguf and llama.cpp's CUDA build on the same stand-ins, in one
# lease. Each stage fits one device call (10 minutes); state persists in $LADDER (default /tmp/ladder) while
# the machine stays warm, so run the stages in consecutive calls:
#   bash tools/device_ladder.sh setup models      # loader + wheels; the stand-ins (tools/ladder.py, numpy)
#   bash tools/device_ladder.sh llamacpp-build     # llama.cpp with CUDA (4-6 minutes on 16 cores)
#   bash tools/device_ladder.sh webgguf            # webgguf bench on every model, and the streaming read
#   bash tools/device_ladder.sh llamacpp table     # llama-bench on every model; the ratio table
# Carried paths (prepared on the development machine; all git-ignored):
#   .gl    the loader debs (apt-get download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libgles2 libopengl0:
#          with libvulkan1 alone the NVIDIA driver's ICD fails to load)
#   .whl   wgpu 0.32.0 + cffi, pycparser, sniffio wheels for the device's Python (docs/PERF.md says how)
#   .lcpp  llama.cpp's sources as llama.cpp.tgz (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp)
#   .bench/vocab  the vocabulary GGUFs (python tools/ladder.py vocab .bench/vocab)
#   .bench/headers  optional: real headers of small models (tools/make_standin.py header), also benchmarked
# MODELS (space-separated recipe names) limits the ladder; default: every recipe of tools/ladder.py.
set -u
LADDER=${LADDER:-/tmp/ladder}
mkdir -p "$LADDER/models" "$LADDER/results"
export PYTHONPATH=/tmp/site:$PWD/py VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
recipes=${MODELS:-$(python3 tools/ladder.py list | awk '{print $1}')}

models() {  # every model file of the ladder, small ones first
  for f in "$LADDER"/models/*.gguf; do echo "$(stat -c %s "$f") $f"; done | sort -n | awk '{print $2}'
}

for stage in "$@"; do
  case $stage in
  setup)
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LADDER/results/gpu.txt"
    ;;
  models)
    for r in $recipes; do
      [ -s "$LADDER/models/$r.gguf" ] || python3 tools/ladder.py make "$r" .bench/vocab "$LADDER/models/$r.gguf" &
    done
    for h in .bench/headers/*.header; do
      [ -e "$h" ] || continue
      out="$LADDER/models/$(basename "$h" .header).gguf"
      [ -s "$out" ] || python3 tools/make_standin.py expand "$h" "$out" &
    done
    wait
    ls -la "$LADDER/models"
    ;;
  llamacpp-build)
    LCPP_TGZ=.lcpp/llama.cpp.tgz
    if [ ! -x /tmp/lcpp/build/bin/llama-bench ]; then
      mkdir -p /tmp/lcpp && tar xzf "$LCPP_TGZ" -C /tmp/lcpp
      cmake -S /tmp/lcpp -B /tmp/lcpp/build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF \
        > /tmp/lcpp-cmake.log 2>&1 || tail -20 /tmp/lcpp-cmake.log
      cmake --build /tmp/lcpp/build -j "$(nproc)" --target llama-bench > /tmp/lcpp-build.log 2>&1 || tail -30 /tmp/lcpp-build.log
    fi
    ls -la /tmp/lcpp/build/bin/llama-bench
    ;;
  webgguf)
    python3 tools/bench_bandwidth.py --json | tee "$LADDER/results/bandwidth.json"
    for m in $(models); do
      name=$(basename "$m" .gguf)
      [ -s "$LADDER/results/webgguf-$name.json" ] && continue
      timeout 300 python3 -m webgguf.cli bench "$m" --prompt-tokens 512 --gen-tokens 128 --json \
        > "$LADDER/results/webgguf-$name.json" || echo "webgguf bench failed on $name"
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['prefill_tok_s'], r['decode_tok_s'], r['decode_gb_s'], r['peak_gpu_bytes'])" \
        "$LADDER/results/webgguf-$name.json" "$name" 2>/dev/null
    done
    ;;
  llamacpp)
    for m in $(models); do
      name=$(basename "$m" .gguf)
      [ -s "$LADDER/results/llamacpp-$name.json" ] && continue
      timeout 240 /tmp/lcpp/build/bin/llama-bench -m "$m" -ngl 99 -p 512 -n 128 -fa 0,1 -r 5 -o json \
        > "$LADDER/results/llamacpp-$name.json" 2> "$LADDER/results/llamacpp-$name.log" || echo "llama-bench failed on $name"
    done
    ;;
  table)
    python3 tools/ladder_table.py "$LADDER/results"
    mkdir -p "${OUT:-/tmp/out}" && tar czf "${OUT:-/tmp/out}/ladder-results.tgz" -C "$LADDER" results
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
