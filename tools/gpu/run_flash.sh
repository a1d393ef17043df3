#!/usr/bin/env bash
# On the lent GPU machine (.gpu/ carried): the full V4-Flash shape (bench --synthetic flash, weights generated in
# GPU memory) on 1 GPU and, when there are 2, on 2 GPUs (expert parallelism); then a per-stage profile. Logs under
# $OUT; the lines that matter last. Arguments: the GPU counts to run (default: 1 2).
. tools/gpu/env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${DSV4_NCCL:-}" ] && ! ls /usr/local/cuda/lib64/libnccl.so.2 >/dev/null 2>&1; then
  DSV4_NCCL=$(find / -name 'libnccl.so.2' 2>/dev/null | head -1); export DSV4_NCCL
fi
GPUS=${*:-1 2}
for n in $GPUS; do
  echo "== flash, $n GPU(s), official" >>"$OUT/flash.log"
  /usr/bin/time -v timeout 240 .gpu/dsv4 bench --synthetic flash --device cuda --gpus "$n" --mode official --prompt 1024 --decode 16 \
      --streams 1,8,32,64 >>"$OUT/flash.log" 2>>"$OUT/flash.err"
  echo "exit $?" >>"$OUT/flash.log"
done
timeout 150 .gpu/dsv4 bench --synthetic flash --device cuda --mode official --prompt 512 --decode 8 --profile >"$OUT/flash-profile.log" 2>&1
grep -E "^==|^model|synthetic|bandwidth|prefill|decode, 1|weight traffic|fraction|GPU [0-9]:|^ +[0-9]+ +[0-9.]+ +[0-9.]+x|exit|rror" "$OUT/flash.log"
tail -5 "$OUT/flash.err"
echo "== profile:"; grep -E "ms/step|prefill of|decode," "$OUT/flash-profile.log" | head -40
