#!/bin/bash
# The page on a lent NVIDIA machine: Chromium's WebGPU on the GPU (under Xvfb) against native `webgguf
# bench` and wllama's WebGPU on the same files (tools/page_bench.py), in one lease. A device call carries
# at most 64 MiB and lasts at most 10 minutes, so the stages go in consecutive calls (the machine keeps
# /root/stash, /opt and $LADDER while it stays warm, ~30 s between calls):
#   call 1, carrying .cb0 .gl .whl:       bash tools/device_browser.sh stash setup
#   call 2, carrying .cb1 .bench:         bash tools/device_browser.sh stash models
#   call 3, carrying .cb2:                bash tools/device_browser.sh stash
#   call 4, carrying .cbz .cbx .gl web/dist:  bash tools/device_browser.sh chromium run
#   (or, carrying .cbz .cbx:              bash tools/device_browser.sh chromium adapter)
# Real models (for `parity`, and as bench models) come in pieces (split -b 45M -d FILE NAME.), a folder of
# pieces per call: PARTS="dir..." bash tools/device_browser.sh parts; then `join` makes NAME.gguf of them.
# Carried paths (git-ignored, prepared on the development machine):
#   .cb0 .cb1 .cb2 .cbz .cbx  Debian's chromium with its libraries in three zstd parts, a zstd binary, Xvfb
#                             (docs/PERF.md "The page on a GPU" says how they are made)
#   .gl .whl .bench           as for tools/device_ladder.sh (loader debs, wgpu wheels, vocab GGUFs and
#                             real headers of small models)
#   web/dist                  the built page (python tools/build_web.py), with bench.html and wllama
# MODELS: ladder recipes to make (tools/ladder.py list; default qwen2.5-0.5b llama-3.2-1b qwen2.5-7b);
# RUN_MODELS: the model files (names without .gguf) of the run stage (default all, small ones first);
# RUN_ARGS: extra arguments of tools/page_bench.py in the run stage (e.g. "--batch 4,32 --loads 3").
set -u
LADDER=${LADDER:-/tmp/ladder}
export MODELS=${MODELS:-qwen2.5-0.5b llama-3.2-1b qwen2.5-7b}
export PYTHONPATH=/tmp/site:$PWD/py VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1

for stage in "$@"; do
  case $stage in
  stash)  # keep this call's part of chromium for a later call
    mkdir -p /root/stash && cp .cb[0-9]/part.* /root/stash/ 2>/dev/null
    ls /root/stash
    ;;
  setup)
    bash tools/device_ladder.sh setup
    ;;
  models)  # stand-ins: the real headers of SmolLM2 and Gemma 3, and the ladder's recipes
    bash tools/device_ladder.sh models
    ;;
  parts)  # real model files too big for one call, carried in pieces NAME.00, NAME.01, ... in folders $PARTS
    mkdir -p "$LADDER/parts" && for d in ${PARTS:-}; do cp "$d"/* "$LADDER/parts/"; done
    ls "$LADDER/parts"
    ;;
  join)  # NAME.00 NAME.01 ... -> $LADDER/models/NAME.gguf
    for first in "$LADDER"/parts/*.00; do
      name=$(basename "$first" .00)
      cat "$LADDER/parts/$name".[0-9][0-9] > "$LADDER/models/$name.gguf" && ls -la "$LADDER/models/$name.gguf"
    done
    ;;
  parity)  # the page's greedy tokens against native on the GPU, for the joined real models
    DISPLAY=:99 python3 tools/page_parity.py --chromium /opt/bundle/run-chromium ${PARITY_MODELS:-$(ls "$LADDER"/models/*.gguf)}
    ;;
  chromium)  # unpack chromium and Xvfb, start Xvfb on :99
    if [ ! -x /opt/bundle/chromium/chromium ]; then
      cat /root/stash/part.* | LD_LIBRARY_PATH=.cbz .cbz/zstd -d -q | tar x -C /opt || exit 1
    fi
    mkdir -p /opt/x && tar xzf .cbx/x.tgz -C /opt/x && cp /opt/x/usr/bin/xkbcomp /usr/bin/xkbcomp
    pgrep -f "Xvfb :99" > /dev/null || (LD_LIBRARY_PATH=/opt/x/lib setsid /opt/x/usr/bin/Xvfb :99 -screen 0 1280x800x24 \
      -nolisten tcp -xkbdir /opt/x/usr/share/X11/xkb > /tmp/xvfb.log 2>&1 &)
    # chromium with its own libraries (only it: the native runs keep the system's Vulkan loader)
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/bundle/lib:/opt/bundle/chromium exec /opt/bundle/chromium/chromium "$@"\n' > /opt/bundle/run-chromium
    chmod +x /opt/bundle/run-chromium
    sleep 2
    /opt/bundle/run-chromium --version
    ;;
  adapter)  # what Chromium's WebGPU adapter offers here: features, subgroup-matrix configurations
    DISPLAY=:99 python3 tools/page_adapter.py --chromium /opt/bundle/run-chromium
    ;;
  run)  # every model, small ones first
    mkdir -p "$LADDER/results" "${OUT:-/tmp/out}"
    files=$(for f in "$LADDER"/models/*.gguf; do echo "$(stat -c %s "$f") $f"; done | sort -n | awk '{print $2}')
    if [ -n "${RUN_MODELS:-}" ]; then files=$(for m in $RUN_MODELS; do echo "$LADDER/models/$m.gguf"; done); fi
    # shellcheck disable=SC2086
    DISPLAY=:99 python3 tools/page_bench.py --chromium /opt/bundle/run-chromium --json "$LADDER/results/page_bench.jsonl" ${RUN_ARGS:-} $files
    cp "$LADDER/results/page_bench.jsonl" "${OUT:-/tmp/out}/"
    python3 tools/page_bench_table.py "$LADDER/results/page_bench.jsonl"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
