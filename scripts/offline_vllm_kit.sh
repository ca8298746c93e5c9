#!/usr/bin/env bash
# vLLM 0.34.0 for a GPU host with no network whose image has Python 3.12, CUDA 13's libraries, transformers 5.17
# and torch 2.11 (which vLLM 0.34 cannot use): torch 2.14.0, Triton 3.8.0, NCCL 2.32.6 (torch 2.14 asks 2.30.7,
# which the registry no longer has; 2.32 keeps its ABI), torchvision 0.29.0 and vLLM 0.34.0 as one tar.xz cut
# into parts that fit a 64 MiB transfer, and the small packages vLLM's offline path imports as deps.tar.
# FlashInfer is not in it: the host brings its own (0.7.4 for the 0.7.3 vLLM 0.34 pins, which is not on PyPI).
#   bash scripts/offline_vllm_kit.sh [KIT]        # KIT defaults to .gpu-vllm034; about 15 minutes on 2 cores
# On the host, from the checkout: `bash KIT/stage.sh` in each call that brings a part (exit 2 until all are
# there), then `bash KIT/run.sh [vllm_proof.py arguments]`, which installs dist/*.whl beside vLLM and runs
# scripts/vllm_proof.py. The archive unpacks to about 2.2 GiB under /tmp.
set -euo pipefail
part_mib=61
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_offline_kit.sh
start_kit "${1:-.gpu-vllm034}"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_31_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
# The CuTe DSL at vLLM's pin (nvidia-cutlass-dsl[cu13]): the kernel warm-up imports `cutlass` on every CUDA GPU
# (its MiniMax-M3 MSA warm-up); the image has cuda-bindings and protobuf, which it needs.
big=(torch==2.14.0 triton==3.8.0 nvidia-nccl-cu13==2.32.6 torchvision==0.29.0 vllm==0.34.0
     nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0 nvidia-cutlass-dsl-libs-core==4.8.0
     nvidia-cutlass-dsl-libs-cu13==4.8.0)
# What `from vllm import LLM`, its engine, the V2 model runner, FlashInfer's backend and ngram drafting import
# that the image lacks (found by importing every module under those packages); tokenizers 0.23.3 for vLLM's pin;
# compressed-tensors (vLLM's pin) and loguru, which the model loader imports as it loads a model; quack-kernels
# (vLLM's pin), which the kernel warm-up imports on SM90 for a bf16 MoE router (installed without its deps).
deps=(pydantic==2.13.5 pydantic-core==2.46.5 annotated-types==0.8.0 typing-inspection==0.4.4 msgspec==0.21.1
      pyzmq==27.1.0 cbor2==6.1.3 pybase64==1.4.3 cachetools==7.2.0 partial-json-parser==0.2.1.1.post7
      fastapi==0.136.3 starlette==1.7.0 openai==2.54.0 jiter==0.16.0 distro==1.9.0 sniffio==1.3.1
      xgrammar==0.2.8 llguidance==1.7.6 blake3==1.0.9 depyf==0.20.0 astor==0.8.1 dill==0.4.1
      tokenizers==0.23.3 oss-harmony==0.0.11 setproctitle==1.3.7 nvtx==0.2.15 compressed-tensors==0.17.0
      loguru==0.7.3 quack-kernels==0.6.5)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/big" "${big[@]}"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/deps" "${deps[@]}"
site=$work/site
python3 -m pip install -q --no-deps --no-compile --no-index "${plat[@]}" --target "$site" "$work"/big/*.whl
rm -rf "$site/bin"
# Dropped, none on this path: Triton's CUPTI (its profiler only) and Blackwell's ptxas (sm100 and later); torch's
# protoc; vLLM's FlashAttention-2 kernels (imported under try/except; FA3 stays) and its Rust API server.
rm -rf "$site"/triton/backends/nvidia/lib/cupti* "$site"/triton/backends/nvidia/bin/ptxas-blackwell \
  "$site"/torch/bin/protoc* "$site"/vllm/vllm_flash_attn/_vllm_fa2_C*.so "$site"/vllm/vllm-rs
pack_kit "$site" "$work/deps" "$kit" vllm034 "$part_mib"

cat > "$kit/env.sh" <<'EOS'
# Source from the checkout after the host's own FlashInfer is on PYTHONPATH and stage.sh said ready: torch 2.14,
# Triton 3.8, NCCL 2.32 and vLLM 0.34 come first on the path.
[ -f /tmp/vllm034-site/.ok ] && [ -f /tmp/vllm034-deps/.ok ] || { echo "vllm034 kit not staged" >&2; return 1; }
# The CuTe DSL puts `cutlass` on the path from a .pth file, which Python reads in site-packages only.
dsl=/tmp/vllm034-site/nvidia_cutlass_dsl/dsl_packages
export PYTHONPATH="$PWD:/tmp/vllm034-site:$dsl:/tmp/vllm034-deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 MAX_JOBS=${MAX_JOBS:-16}
# vLLM counts FlashInfer as available only with nvcc on PATH
command -v nvcc >/dev/null 2>&1 || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"; }
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/vllm034-cache/vllm}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
EOS

{ cat <<'EOS'
#!/usr/bin/env bash
# From the checkout, once stage.sh said ready: bash KIT/run.sh [vllm_proof.py arguments]. Installs dist/*.whl
# beside vLLM (vLLM finds the plugin's entry point as in a user's install), prints the versions, checks that vLLM's
# own loader loads the plugin and every seam is patched (scripts/vllm_plugin_loads.py), then runs the proof.
EOS
  run_head
  cat <<'EOS'
python3 - <<'EOF'
import importlib.metadata as md, torch, triton, vllm, flashinfer, transformers
print("torch", torch.__version__, "| triton", triton.__version__, "| vllm", vllm.__version__, "| flashinfer",
      flashinfer.__version__, "| transformers", transformers.__version__, "| nccl",
      ".".join(map(str, torch.cuda.nccl.version())), "|", torch.cuda.get_device_name())
print("vllm.general_plugins:", [e.name for e in md.entry_points(group="vllm.general_plugins")])
EOF
python3 scripts/vllm_plugin_loads.py 2>&1 | grep -v "set in __init__" || echo "the plugin load check failed"
[ $# -gt 0 ] || exit 0
python3 scripts/vllm_proof.py --out "${OUT:-/tmp/out}/vllm034" "$@"
EOS
} > "$kit/run.sh"
chmod +x "$kit"/*.sh
echo "$kit: $(ls "$kit" | grep -c '^part-') parts and deps.tar; carry each part with stage.sh and MANIFEST, one a call"
