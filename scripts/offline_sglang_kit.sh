#!/usr/bin/env bash
# SGLang 0.5.23 for a GPU host with no network whose image has Python 3.12, CUDA 13's libraries, transformers 5.17
# and torch 2.11 (which SGLang 0.5.23 cannot use): torch 2.14.1, Triton 3.8.0, NCCL 2.30.7 (torch 2.14.1's pin; its
# manylinux_2_18 wheel is on the registry again), torchvision 0.29.1 (the host's 0.26 has no ops for torch 2.14),
# sglang-kernel 0.4.10 (SGLang's pin), SGLang 0.5.23, the CuTe DSL 4.8.0 (SGLang's pin) and, off the path unless
# chosen, FlashInfer 0.7.2 (SGLang's pin) with apache-tvm-ffi 0.1.11 (SGLang's pin) as one tar.xz cut into parts that
# fit a 64 MiB transfer, and the small packages SGLang's offline path imports as deps.tar. By default FlashInfer
# comes from the host's own kit (.gpu, 0.7.4, which passes SGLang's check `flashinfer_python >= 0.7.2`);
# SGLANG_FLASHINFER=0.7.2 picks the kit's (env.sh). FlashInfer's cubin and JIT-cache wheels are not in it (hundreds
# of MiB and GiBs): its kernels build on first use.
#   bash scripts/offline_sglang_kit.sh [KIT]      # KIT defaults to .gpu-sglang0523; about 12 minutes on 2 cores
# ON_VLLM_KIT=1 makes SGLang and sglang-kernel alone, for a host that stages scripts/offline_vllm_kit.sh's kit first:
# SGLang runs on that kit's torch 2.14.0, Triton 3.8.0, NCCL 2.32.6 and torchvision 0.29.0 (SGLang pins torch 2.14.1,
# NCCL 2.30.7 and torchvision 0.29.1: sglang-kernel, built on 2.14.1, imports on 2.14.0, a patch release, as seen on
# an H100) and its CuTe DSL 4.8.0 (SGLang's pin), with vLLM left off its path. Two carries in place of 15, and
# minutes less to build.
# On the host, from the checkout: `bash KIT/stage.sh` in each call that brings a part (exit 2 until all are
# there), then `bash KIT/run.sh [sglang_proof.py arguments]`, which installs dist/*.whl beside SGLang and runs
# scripts/sglang_proof.py.
set -euo pipefail
part_mib=61
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_offline_kit.sh
start_kit "${1:-.gpu-sglang0523}"
# SGLang 0.5.23's wheel is cp312 manylinux_2_34 (it holds Rust extensions); NCCL 2.30.7's is manylinux_2_18
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
# The CuTe DSL at SGLang's pin (nvidia-cutlass-dsl[cu13]): on CUDA the Llama MLP imports `cutlass` (DualGemm)
dsl=(nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0 nvidia-cutlass-dsl-libs-core==4.8.0
     nvidia-cutlass-dsl-libs-cu13==4.8.0)
big=(torch==2.14.1 triton==3.8.0 nvidia-nccl-cu13==2.30.7 torchvision==0.29.1 sglang==0.5.23 sglang-kernel==0.4.10
     "${dsl[@]}")
on_vllm_kit=${ON_VLLM_KIT:-0}
[ "$on_vllm_kit" = 1 ] && big=(sglang==0.5.23 sglang-kernel==0.4.10)
fi_pin=(flashinfer-python==0.7.2 apache-tvm-ffi==0.1.11)
# What `import sglang`, sglang.Engine's engine, tokenizer manager, scheduler, detokenizer, model runner, decode and
# prefill CUDA-graph runners, FlashInfer's backend, the Llama and Qwen3 models, the model loader, sampler, radix
# cache and xgrammar backend import that the image lacks (found by importing each of those modules with the wheels
# unpacked, on a CPU torch made to look like CUDA 13 on SM90; each ModuleNotFoundError named a package). Pinned as
# SGLang pins them where it does (compressed-tensors, openai, xgrammar, transformers 5.19 over the image's 5.17);
# pydantic, fastapi and starlette as the vLLM kit has them (fastapi after 0.136 imports opentelemetry);
# IPython (sglang/utils.py imports IPython.display) with traitlets; cuda-python 13.0.3 (FlashInfer's cuda_utils,
# which the models import through its comm module; torch 2.14.1 asks cuda-bindings >= 13.0.3, and the host's driver
# is CUDA 13.0's). jiter for openai. Not carried, though SGLang requires them: what the offline path never imports
# (flash-attn-4, tilelang, quack-kernels, sgl-deep-gemm/-deep-ep/-flash-mla, humming-kernels,
# nvshmem4py, outlines, llguidance, torchaudio, torchcodec, ...: the model registry skips models that need them) and
# what the image has (tokenizers 0.23.2 is SGLang's pin; numba, sentencepiece and the rest at the image's versions).
deps=(pydantic==2.13.5 pydantic-core==2.46.5 annotated-types==0.8.0 typing-inspection==0.4.4
      orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 uvloop==0.23.0 setproctitle==1.3.8
      fastapi==0.136.3 starlette==1.7.0 uvicorn==0.55.0 openai==2.8.0 jiter==0.16.0 distro==1.9.0 sniffio==1.3.1
      partial-json-parser==0.2.1.1.post7 compressed-tensors==0.18.0 loguru==0.7.3 nvidia-ml-py==13.615.71
      gguf==0.19.0 dill==0.4.1 einops==0.8.2 xgrammar==0.2.7 transformers==5.19.0 ipython==9.19.1 traitlets==5.16.1
      cuda-python==13.0.3 cuda-bindings==13.0.3 cuda-pathfinder==1.9.1)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/big" "${big[@]}"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/fi" "${fi_pin[@]}"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/deps" "${deps[@]}"
site=$work/site
python3 -m pip install -q --no-deps --no-compile --no-index "${plat[@]}" --target "$site" "$work"/big/*.whl
# FlashInfer 0.7.2 in a folder of its own (not a module name, so off the path until env.sh puts it there), trimmed
# as the host's make-kit.sh trims 0.7.4: the CUDA sources of kernel families other than attention's are dropped
fi_site=$site/flashinfer-0.7.2
python3 -m pip install -q --no-deps --no-compile --no-index "${plat[@]}" --target "$fi_site" "$work"/fi/*.whl
find "$fi_site/flashinfer/data/csrc" -mindepth 1 -maxdepth 1 -type d ! -name xqa -exec rm -rf {} +
rm -rf "$fi_site/flashinfer/data/cutlass/python" "$fi_site/flashinfer/data/cutlass/examples" \
  "$fi_site/flashinfer/data/cccl/python" "$fi_site/bin"
rm -rf "$site/bin"
# Dropped, none on this path (Hopper, FlashInfer attention, dense Llama/Qwen3 in bf16):
# - sgl_kernel/flash_ops.abi3.so (1.1 GB: sgl-kernel's FlashAttention-3, imported only inside the FA3, DSA and XPU
#   backends and vision attention, never by `import sgl_kernel`), flashmla_ops (DeepSeek's MLA), infllm_ops (built
#   for CPython 3.10 only: it cannot load on 3.12) and sm100/ (Blackwell's common_ops: SM90 loads sm90/);
# - SGLang's Rust extensions for its Rust HTTP/gRPC servers and benchmarks (srt/rust_extensions/_server, _grpc,
#   _bench: loaded only by rust_server/ and http_server's Rust path) and multimodal_gen/ (the diffusion runtime);
# - as the vLLM kit: Triton's CUPTI (its profiler only) and Blackwell's ptxas; torch's protoc.
rm -rf "$site"/sgl_kernel/flash_ops*.so "$site"/sgl_kernel/flashmla_ops*.so "$site"/sgl_kernel/infllm_ops*.so \
  "$site"/sgl_kernel/sm100 "$site"/sglang/srt/rust_extensions/_server*.so "$site"/sglang/srt/rust_extensions/_grpc*.so \
  "$site"/sglang/srt/rust_extensions/_bench*.so "$site"/sglang/multimodal_gen \
  "$site"/triton/backends/nvidia/lib/cupti* "$site"/triton/backends/nvidia/bin/ptxas-blackwell "$site"/torch/bin/protoc*
pack_kit "$site" "$work/deps" "$kit" sglang0523 "$part_mib"

cat > "$kit/env.sh" <<'EOS'
# Source from the checkout after the host's own FlashInfer is on PYTHONPATH (source .gpu/env.sh first) and stage.sh
# said ready: torch 2.14.1, Triton 3.8, NCCL 2.30.7, sglang-kernel 0.4.10 and SGLang 0.5.23 come first on the path.
# Which FlashInfer: SGLANG_FLASHINFER=host (the default: the one already on PYTHONPATH, .gpu's 0.7.4 with its
# apache-tvm-ffi and prebuilt kernels) or SGLANG_FLASHINFER=0.7.2 (the kit's, SGLang's pin, with apache-tvm-ffi
# 0.1.11, put ahead of the host's). With no FlashInfer on PYTHONPATH, host falls back to 0.7.2.
[ -f /tmp/sglang0523-site/.ok ] && [ -f /tmp/sglang0523-deps/.ok ] || { echo "sglang0523 kit not staged" >&2; return 1; }
SGLANG_FLASHINFER=${SGLANG_FLASHINFER:-host}
if [ "$SGLANG_FLASHINFER" = host ]; then
  _fi=; for _p in ${PYTHONPATH//:/ }; do [ -d "$_p/flashinfer" ] && _fi=$_p && break; done
  [ -n "$_fi" ] || { echo "sglang0523: no FlashInfer on PYTHONPATH; using the kit's 0.7.2" >&2; SGLANG_FLASHINFER=0.7.2; }
  unset _p _fi
fi
case $SGLANG_FLASHINFER in
  host) _fi= ;;
  0.7.2) _fi=:/tmp/sglang0523-site/flashinfer-0.7.2 ;;
  *) echo "SGLANG_FLASHINFER is host or 0.7.2, not $SGLANG_FLASHINFER" >&2; return 1 ;;
esac
export SGLANG_FLASHINFER
# The CuTe DSL puts `cutlass` on the path from a .pth file, which Python reads in site-packages only.
_dsl=/tmp/sglang0523-site/nvidia_cutlass_dsl/dsl_packages
export PYTHONPATH="$PWD:/tmp/sglang0523-site$_fi:$_dsl:/tmp/sglang0523-deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset _dsl _fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 MAX_JOBS=${MAX_JOBS:-16}
command -v nvcc >/dev/null 2>&1 || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"; }
# FlashInfer's JIT builds (0.7.2 has no prebuilt kernels here) and Triton's cache outlive a call while the host is warm
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/sglang0523-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/sglang0523-cache/triton}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EOS
if [ "$on_vllm_kit" = 1 ]; then cat >> "$kit/env.sh" <<'EOS'
# Built with ON_VLLM_KIT=1: torch, Triton, NCCL and torchvision from the vLLM kit's site, staged first, seen through
# links to all of it but vLLM (SGLang imports vLLM's kernels where it finds vLLM)
[ -f /tmp/vllm034-site/.ok ] || { echo "sglang0523: stage the vLLM kit (scripts/offline_vllm_kit.sh) first" >&2; return 1; }
_view=/tmp/sglang0523-torch
if [ ! -d "$_view" ]; then
  rm -rf "$_view.tmp" && mkdir -p "$_view.tmp"
  for _e in /tmp/vllm034-site/*; do case ${_e##*/} in vllm|vllm-*) ;; *) ln -s "$_e" "$_view.tmp/" ;; esac; done
  mv "$_view.tmp" "$_view"
fi
# and the CuTe DSL, which SGLang 0.5.23 pins at the vLLM kit's version (4.8.0)
export PYTHONPATH="${PYTHONPATH/\/tmp\/sglang0523-deps/\/tmp\/sglang0523-deps:$_view:$_view/nvidia_cutlass_dsl/dsl_packages}"
unset _view _e
EOS
fi

{ cat <<'EOS'
#!/usr/bin/env bash
# From the checkout, once stage.sh said ready: bash KIT/run.sh [sglang_proof.py arguments]
# (SGLANG_FLASHINFER=0.7.2 bash KIT/run.sh ... for SGLang's pinned FlashInfer). Installs dist/*.whl beside SGLang
# (SGLang finds the plugin's entry point, group sglang.srt.plugins, as in a user's install), prints the versions,
# then runs the proof. With no arguments it stops after the versions.
EOS
  run_head
  cat <<'EOS'
python3 - <<'EOF'
import importlib.metadata as md, torch, triton, sgl_kernel, sglang, flashinfer, transformers
print("torch", torch.__version__, "| triton", triton.__version__, "| sglang", sglang.__version__, "| sglang-kernel",
      sgl_kernel.__version__, "| flashinfer", flashinfer.__version__, "from", flashinfer.__file__.rsplit("/", 2)[0],
      "| transformers", transformers.__version__, "| nccl", ".".join(map(str, torch.cuda.nccl.version())), "|",
      torch.cuda.get_device_name())
print("sglang.srt.plugins:", [e.name for e in md.entry_points(group="sglang.srt.plugins")])
EOF
[ $# -gt 0 ] || exit 0
python3 scripts/sglang_proof.py --out "${OUT:-/tmp/out}/sglang0523" "$@"
EOS
} > "$kit/run.sh"
chmod +x "$kit"/*.sh
echo "$kit: $(ls "$kit" | grep -c '^part-') parts and deps.tar; carry each part with stage.sh and MANIFEST, one a call"
