/*
 * CUDA backend: the attention kernels of head dimension 128 (decode and chunked
 * prefill, with and without the copy pipeline, and the split-KV merge), in a
 * file of their own so that the build compiles the head dimensions in
 * parallel (cuda/attention.cuh holds them; cuda/attention.cu launches them).
 */
#include "attention.cuh"

namespace kvp_attn {
KVP_ATTN_DIM(128)
} // namespace kvp_attn
