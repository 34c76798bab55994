#!/usr/bin/env bash
# One device run: install the carried wheels, then GPU tests, `vitcg check --device cuda`, and the benchmark.
# Usage (on the GPU machine, from the repository root): benchmarks/gpu_run.sh STEP... with OUT set.
# Steps: gate (issue 36's GPU gate: exits 1 unless it passes; gate-a then gate-b: the same in two calls), env, tests, tests-gpu, ttft, ttft-planned, ttft-final, bench-qwen3-planned, bench-internvl-planned, ttft-profile, ttft-profile-internvl, attention-sweep, attention-kernel, attention-swap, attention-triton, tests-attention, bench-three, mixed-profile-qwen3, qwen3-final, compile-start-pyc, compile-start-cold, router-ttft, router-bench, profile-mixed, ttft-focus, compile-start, bench-roofline, check, check-real, check-real-new, check-real-all, check-real-packed, check-real-final, bench-final, check-real-s3, bench-s3 (EXTRA: more spec names), bench-plan, profile, profile-compile, bench-compile, mixed-profile, mixed-profile-rows, tests-plugin, tests-regions, eager-path, bench-new-a, bench-new-b, bench-qwen2, bench-quick, bench-rest, bench-smoke,
# bench-all-a, bench-all-b (every spec, in two halves that each fit one device call), plugin-gain, plugin-compiled, plugin-route, plugin-planned, eager-sizes, kernel-ab (OLD_KERNEL: a former varlen_triton.py), ttft-h200, plugin-equal, eager-compiled, eager-first, sides-ttft, bench-sides, replace (SPECS: the specs whose graphs run a replace or the new providers),
# plugin-dp (2 GPUs); each with a time limit.
set -uo pipefail
OUT=${OUT:-/tmp/vitcg-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
EXTRA=${EXTRA:-}
export PYTHONUNBUFFERED=1 VITCG_CACHE_DIR=/tmp/vitcg-cache
run() { local limit=$1 log=$2; shift 2; echo "== $* (limit ${limit}s)" | tee -a "$OUT/$log"; \
  ( time timeout "$limit" "$@" ) 2>&1 | tee -a "$OUT/$log"; }
gate_tests() { run "$1" gate.log python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_packed_attention_gpu.py \
  tests/gpu/test_cache_across_processes_gpu.py tests/gpu/test_regions_gpu.py tests/engine/test_vllm_protocol_cuda.py
  tests=$?; }
eager_sizes() { run 200 eager.log python3 benchmarks/eager_first_call.py qwen2_vl --workload 1x224 --workload mixed \
  --workload 8x224 --workload 1x448 --workload video4x448 --workload image+video --iters 3 --json "$1"; }
gate_ttft() { run "$1" gate.log python3 benchmarks/generate_ttft.py qwen2_vl --iters 10 --json "$OUT/gate_ttft.json"
  ttft=$?; }
for step in "$@"; do
  case $step in
    env) { nvidia-smi; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, \
transformers.__version__, torch.cuda.get_device_name())"; python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)"; } \
      > "$OUT/env.txt" 2>&1 ;;
    gate)  # issue 36's GPU gate, one device call (< 10 min on a fast host): every spec at real size, the GPU plugin,
      # regions, packed-attention and cross-process cache tests, the TTFT router rows; benchmarks/gate.py gives the verdict
      run 240 gate.log python3 -m vitcg check --all --device cuda --size real; check=$?
      gate_tests 240; gate_ttft 90
      python3 benchmarks/gate.py "$OUT/gate_ttft.json" check=$check tests=$tests ttft=$ttft | tee -a "$OUT/gate.log"
      gate=${PIPESTATUS[0]} ;;
    gate-a)  # the same gate in two device calls, for a slower host: gate-a is every spec at real size ...
      run 560 gate.log python3 -m vitcg check --all --device cuda --size real; check=$?
      python3 benchmarks/gate.py - check=$check | tee -a "$OUT/gate.log"; gate=${PIPESTATUS[0]} ;;
    gate-b)  # ... and gate-b the GPU tests and the TTFT rows; the gate passed when both calls print "GATE: passed"
      gate_tests 400; gate_ttft 150
      python3 benchmarks/gate.py "$OUT/gate_ttft.json" tests=$tests ttft=$ttft | tee -a "$OUT/gate.log"
      gate=${PIPESTATUS[0]} ;;
    tests) run 420 gpu.log python3 -m pytest -q -p no:cacheprovider tests/gpu tests/engine tests/hf -m gpu ;;
    ttft) run 400 ttft.log python3 benchmarks/generate_ttft.py --json "$OUT/ttft.json" ;;
    check) run 200 gpu.log python3 -m vitcg check --all --device cuda ;;
    check-real) run 200 gpu.log python3 -m vitcg check --all --device cuda --size real ;;
    bench-qwen2) run 400 bench.log python3 -m vitcg bench qwen2_vl --device cuda --json "$OUT/bench_qwen2_vl.json" ;;
    bench-quick) run 400 bench.log python3 -m vitcg bench qwen2_vl qwen2_5_vl --no-compile --device cuda --json "$OUT/bench_quick.json" ;;
    bench-rest) run 560 bench.log python3 -m vitcg bench qwen2_5_vl qwen3_vl qwen3_vl_moe internvl --no-compile --device cuda --json "$OUT/bench_rest.json" ;;
    tests-gpu) run 300 gpu.log python3 -m pytest -q -p no:cacheprovider tests/gpu tests/engine tests/hf -m gpu ;;
    bench-below) run 500 bench.log python3 -m vitcg bench qwen3_vl qwen3_5_moe idefics2 mllama glm_ocr cosmos3_edge \
      internvl --no-compile --iters 10 --device cuda --json "$OUT/bench_below.json" ;;
    router-ttft) run 560 ttft.log python3 benchmarks/generate_ttft.py qwen2_vl qwen3_vl internvl --json "$OUT/ttft_router.json" ;;
    router-bench) run 420 bench.log python3 -m vitcg bench qwen2_vl --no-compile --device cuda --json "$OUT/bench_router.json" ;;
    ttft-focus) run 280 ttft.log python3 benchmarks/generate_ttft.py qwen2_vl qwen3_vl internvl gemma3 --json "$OUT/ttft.json" ;;
    compile-start) run 280 compile.log python3 benchmarks/compile_start.py qwen2_vl --cache-dir "$VITCG_CACHE_DIR" \
      --json "$OUT/compile_start.json" ;;
    compile-start-cold)  # issue 38 item 5: cold, vitcg-cache-only and warm processes from fresh caches, each
      # with a second capture in the same process (the first accelerate of a process against a later one)
      run 400 compile.log python3 benchmarks/compile_start.py qwen2_vl --json "$OUT/compile_start_cold.json" ;;
    compile-start-pyc) run 360 compile.log python3 benchmarks/compile_start.py qwen2_vl --cache-dir "$VITCG_CACHE_DIR" \
      --pycache /tmp/pyc --profile "$OUT/start-profile.txt" --json "$OUT/compile_start_pyc.json" ;;
    attention-sweep)  # issue 38 item 1: every backend, Triton configuration and packaged head dim at the bench workloads'
      # segment lengths, in TFLOP/s: the segment-block kernel's configurations, the spanning one, cuDNN, FA2, FlexAttention
      run 570 attention.log python3 benchmarks/attention_backends.py --ragged-graph --json "$OUT/attention_sweep.json" ;;
    attention-kernel)  # the same for vitcg's Triton kernels, FlashAttention-2 at the budget and the per-segment cuDNN
      # bar alone, head dims in the order of their users
      run 250 attention.log python3 benchmarks/attention_backends.py --skip-flex --iters 10 \
        --only triton,flash_budget_max,cudnn_segments,cudnn_buckets --json "$OUT/attention_kernel.json" ;;
    attention-swap)  # the encoder's graphs with the runtime's packed attention against the spanning kernel alone
      run 300 swap.log python3 benchmarks/attention_swap.py qwen2_vl qwen3_vl --json "$OUT/attention_swap.json" ;;
    attention-triton) run 300 attention.log python3 benchmarks/attention_backends.py --skip-flex \
      --only triton,flash_budget_max,cudnn_segments --json "$OUT/attention_triton.json" ;;
    tests-attention) run 200 gpu.log python3 -m pytest -q -p no:cacheprovider tests/gpu/test_packed_attention_gpu.py -m gpu ;;
    ttft-planned)  # qwen2_vl's TTFT on the default ladder, then on the one `vitcg plan` picks for these workloads
      run 280 ttft.log python3 benchmarks/generate_ttft.py qwen2_vl --json "$OUT/ttft_default.json"
      run 280 ttft.log python3 benchmarks/generate_ttft.py qwen2_vl --budgets 64,256,1024,1600 \
        --json "$OUT/ttft_planned.json" ;;
    bench-qwen3-planned)  # qwen3_vl's mixed batch on the default ladder, then on the one `vitcg plan qwen3_vl` picks
      run 270 bench.log python3 -m vitcg bench qwen3_vl --workload mixed --device cuda --json "$OUT/bench_qwen3_default.json"
      run 270 bench.log python3 -m vitcg bench qwen3_vl --workload mixed --device cuda --budgets 64,256,448,896,3392 \
        --json "$OUT/bench_qwen3_planned.json" ;;
    bench-internvl-planned)  # internvl's two calls behind torch.compile, on the ladder `vitcg plan internvl` picks
      run 200 bench.log python3 -m vitcg bench internvl --workload mixed --workload image+video --device cuda \
        --budgets 256,512,1024,2048,2560,8192 --json "$OUT/bench_internvl_planned.json" ;;
    ttft-final) run 560 ttft.log python3 benchmarks/generate_ttft.py qwen3_vl internvl --json "$OUT/ttft_final.json" ;;
    ttft-profile) run 200 profile.log python3 benchmarks/ttft_profile.py qwen2_vl mixed3 ;;
    ttft-profile-internvl) run 200 profile.log python3 benchmarks/ttft_profile.py internvl 4x448 ;;
    qwen3-final) run 150 ttft.log python3 benchmarks/generate_ttft.py qwen3_vl --iters 30 --json "$OUT/ttft_qwen3.json"
      run 300 bench.log python3 -m vitcg bench qwen3_vl --device cuda --roofline --json "$OUT/bench_qwen3.json" ;;
    bench-three) run 560 bench.log python3 -m vitcg bench qwen2_5_vl qwen3_vl internvl --device cuda --roofline \
      --json "$OUT/bench_three.json" ;;
    bench-roofline) run 300 bench.log python3 -m vitcg bench qwen2_vl --device cuda --roofline \
      --json "$OUT/bench_roofline.json" --plot "$OUT/roofline-qwen2_vl.png" ;;
    bench-plan)  # the ladder `vitcg plan qwen2_vl` prints for the bench workloads, then the default one, one call
      run 290 bench.log python3 -m vitcg bench qwen2_vl --device cuda --roofline --budgets 64,256,512,1216,4352 \
        --json "$OUT/bench_planned.json"
      run 290 bench.log python3 -m vitcg bench qwen2_vl --device cuda --roofline --json "$OUT/bench_default.json" ;;
    profile-compile) run 120 profile.log python3 benchmarks/host_profile.py --compile qwen2_vl 1x224 8x224 ;;
    bench-compile) run 470 bench.log python3 -m vitcg bench qwen2_5_vl internvl pixtral --iters 10 --device cuda \
      --json "$OUT/bench_compile.json" ;;
    tests-plugin) run 300 gpu.log python3 -m pytest -q -p no:cacheprovider tests/engine/test_vllm_protocol_cuda.py -m gpu -rs ;;
    tests-regions) run 240 gpu.log python3 -m pytest -q -p no:cacheprovider tests/gpu/test_regions_gpu.py -m gpu ;;
    mixed-profile-qwen3) run 300 profile.log python3 benchmarks/mixed_profile.py qwen3_vl --static-only \
      --json "$OUT/mixed_profile_qwen3.json" ;;
    mixed-profile) run 300 profile.log python3 benchmarks/mixed_profile.py qwen2_vl --json "$OUT/mixed_profile.json" ;;
    mixed-profile-rows)  # issue 38's bound: kernel time by kind at the exact budget on qwen2_vl's other compute-bound
      # rows ('+' is not allowed in a name that comes back from the device)
      for w in 8x224 video4x448 image+video; do run 150 profile.log python3 benchmarks/mixed_profile.py qwen2_vl \
        --workload "$w" --static-only --json "$OUT/mixed_profile_${w/+/_}.json"; done ;;
    profile) run 200 profile.log python3 benchmarks/host_profile.py qwen2_vl 1x224 8x224 ;;
    profile-mixed) run 150 profile.log python3 benchmarks/host_profile.py qwen2_vl mixed image+video ;;
    eager-path) run 150 eager_path.log python3 benchmarks/eager_path.py internvl image+video mixed 1x448 \
      --json "$OUT/eager_path_internvl.json" ;;
    bench-new-a) run 330 bench.log python3 -m vitcg bench glm4v llava_onevision mlcd --no-compile --iters 10 \
      --device cuda --json "$OUT/bench_new_a.json" ;;
    bench-new-b) run 330 bench.log python3 -m vitcg bench molmo2 paddleocr_vl gemma4 --no-compile --iters 10 \
      --device cuda --json "$OUT/bench_new_b.json" ;;
    check-real-new) run 240 check.log python3 -m vitcg check glm4v glm4v_moe mlcd cohere2_vision aya_vision molmo2 \
      llava_next llava_onevision paddleocr_vl gemma4 --device cuda --size real ;;
    check-real-s3) run 280 check.log python3 -m vitcg check pixtral lighton_ocr video_llama_3 clip gemma4 $EXTRA \
      --device cuda --size real ;;
    bench-s3) run 500 bench.log python3 -m vitcg bench gemma4 molmo2 clip pixtral video_llama_3 $EXTRA --no-compile \
      --iters 10 --device cuda --json "$OUT/bench_s3.json" ;;
    check-real-final) run 200 check.log python3 -m vitcg check minicpmv4_6 minicpmv4_7 minicpm_ocr kimi_k25 \
      video_llama_3 --device cuda --size real ;;
    bench-final) run 400 bench.log python3 -m vitcg bench minicpmv4_6 minicpm_ocr video_llama_3 lighton_ocr --no-compile \
      --iters 10 --device cuda --json "$OUT/bench_final.json" ;;
    check-real-all) run 300 check.log python3 -m vitcg check --all --device cuda --size real ;;
    check-real-packed)  # real dimensions where the sm90 Triton packed attention serves (head dim >= 32)
      run 300 check.log python3 -m vitcg check qwen2_vl qwen2_5_vl qwen3_vl glm4v paddleocr_vl kimi_k25 minicpmv4_6 \
        video_llama_3 dots3_note --device cuda --size real ;;
    bench-smoke) run 120 bench.log python3 -m vitcg bench hunyuan_vl siglip2 idefics3 --size tiny --no-compile --iters 2 \
      --device cuda --json "$OUT/bench_smoke.json" ;;
    bench-all-a|bench-all-b)
      # every other spec file by name; python, not awk (an awk on the device machine gave overlapping halves)
      specs=$(python3 -c "import glob, sys; print(' '.join(sorted(p for p in glob.glob('vitcg/specs/*.yaml') if not p.endswith('.tests.yaml'))[sys.argv[1] == 'b'::2]))" "${step##*-}")
      run 570 bench.log python3 -m vitcg bench $specs --no-compile --iters 5 --device cuda --json "$OUT/$step.json" ;;
    plugin-gain)  # issue 38 item 4: the stock backend's embed_multimodal against the plugin's path (consumer, real
      # capture), bf16, real towers, every bench workload and 8x448, the default (compiled blocks) and plain blocks; exits 1 on an inequality
      run 540 plugin.log python3 benchmarks/plugin_encode.py qwen2_vl qwen3_vl glm4v hunyuan_vl pixtral --plain \
        --iters 10 --json "$OUT/plugin_gain.json" ;;
    sides-ttft)  # issue 38 item 3: TTFT of default routing against both of its sides (graphs only, eager side)
      run 560 ttft.log python3 benchmarks/generate_ttft.py qwen2_vl qwen3_vl internvl --iters 20 \
        --json "$OUT/ttft_sides.json" ;;
    bench-sides)  # issue 38 items 2-3: bench rows with vitcg+inductor's eager side compiled, against torch.compile
      run 540 bench.log python3 -m vitcg bench qwen2_vl internvl --device cuda --iters 10 --json "$OUT/bench_sides.json" ;;
    eager-first)  # the eager side's first call, cold then from the compile cache (two processes, one cache)
      for run_no in 1 2; do run 270 eager.log python3 benchmarks/eager_first_call.py qwen2_vl internvl \
        --json "$OUT/eager_first_$run_no.json"; done ;;
    eager-sizes)  # the eager side's first call of each size, as the router explores them: what it compiles and loads,
      # cold then from the compile cache (two processes, one cache)
      for run_no in 1 2; do eager_sizes "$OUT/eager_sizes_$run_no.json"; done ;;
    kernel-ab)  # the eager side's first call of each size (eager-sizes' calls, $RUNS processes a side, 2 unless set)
      # with the packed-attention kernel in $OLD_KERNEL (an untracked copy of a former varlen_triton.py) against the
      # current one, each side with fresh Triton, inductor and vitcg caches; the current kernel is back in place after
      cp vitcg/runtime/varlen_triton.py /tmp/kernel-current.py
      for side in old current; do
        rm -rf /tmp/vitcg-cache
        export TRITON_CACHE_DIR=/tmp/triton-$side TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$side
        if [ $side = old ]; then cp "$OLD_KERNEL" vitcg/runtime/varlen_triton.py; else cp /tmp/kernel-current.py vitcg/runtime/varlen_triton.py; fi
        for run_no in $(seq "${RUNS:-2}"); do eager_sizes "$OUT/kernel_${side}_$run_no.json"; done
      done
      unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR ;;
    ttft-h200)  # issue 38 items 3-4 on an H200: the TTFT rows of the three models, default against both sides
      run 300 ttft.log python3 benchmarks/generate_ttft.py qwen2_vl qwen3_vl internvl --iters 10 --json "$OUT/ttft_h200.json" ;;
    eager-compiled)  # issue 38 item 2: the eager forward with blocks compiled with dynamic shapes, against the model's own
      run 560 eager.log python3 benchmarks/eager_compiled.py qwen2_vl qwen3_vl internvl qwen2_5_vl pixtral --iters 10 \
        --json "$OUT/eager_compiled.json" ;;
    plugin-compiled)  # the plugin's GPU tests, the compiled default and its persistent cache among them, timed
      run 400 gpu.log python3 -m pytest -q -p no:cacheprovider -m gpu --durations=0 tests/engine/test_vllm_protocol_cuda.py ;;
    plugin-route)  # the plugin's router on the calls it decides: the compute-bound batch, eight large images, one small one
      run 240 plugin.log python3 benchmarks/plugin_encode.py qwen2_vl glm4v --plain --workload mixed --workload 8x448 \
        --workload 1x224 --iters 10 --json "$OUT/plugin_route.json" ;;
    plugin-planned)  # issue 38: the same, with each model's budgets from `vitcg plan NAME --manager vllm` (the README's
      # advice for compute-bound workloads) instead of vLLM's doubling ladder
      run 400 plugin.log python3 benchmarks/plugin_encode.py qwen2_vl glm4v --plan --plain --workload mixed \
        --workload 8x448 --workload image+video --iters 10 --json "$OUT/plugin_planned.json" ;;
    plugin-equal)  # the same path in float32 (TF32 off): every item within 1e-5 of the stock item, at real size
      run 400 plugin.log python3 benchmarks/plugin_encode.py qwen2_vl qwen3_vl glm4v --dtype float32 --iters 2 \
        --workload mixed --workload image+video --workload 8x448 --json "$OUT/plugin_equal.json" ;;
    replace)  # issue 39 item 5: the specs whose graphs run a replace or the new providers, at real size, and their bench
      run 240 replace.log python3 -m vitcg check ${SPECS:-lfm3_vl} --device cuda --size real
      run 330 replace.log python3 -m vitcg bench ${SPECS:-lfm3_vl} --iters 10 --json "$OUT/bench_replace.json" ;;
    plugin-dp)  # issue 41 item 3, on nvidia-h200-x2: two ranks (NCCL), replicated against data-parallel encoding
      run 400 plugin.log python3 benchmarks/plugin_encode.py qwen2_vl qwen3_vl --ranks 2 --workload 8x448 \
        --workload mixed --iters 10 --json "$OUT/plugin_dp.json" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit "${gate:-0}"
