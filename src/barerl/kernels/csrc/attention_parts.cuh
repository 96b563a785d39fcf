// Attention parts: a query row's attention over disjoint ranges of its keys, merged as one softmax.
//
// Math:    part p gives its normalised output o_p and its log2-sum-exp lse_p (-inf: no keys), and
//            o = sum_p 2^(lse_p - M) o_p / sum_p 2^(lse_p - M),  M = max_p lse_p  (taken online, part by part).
// Layout:  o_part (rows, part_stride, DIM) fp32 and lse_part (rows, part_stride) fp32, rows = (token, head).
// Merging: the CTAs writing the parts of one (token, kv head) never wait for each other. Each writes its part,
//          fences it, and arrives at the pair's count; the last of the num_parts arrivals merges the pair's rows
//          and resets the count to 0, so counts are zeroed once, when allocated, and stay zero between launches.
//          That spares a combine launch, and lets kernels on two streams (cascade attention) fill one set of
//          parts side by side. Parts written on other SMs are read through L2 (ld.global.cg).
#pragma once

// One thread per count, after its CTA's part is written and fenced: whether this is the count's last arrival.
__device__ __forceinline__ bool last_to_arrive(int* count, int num_parts) {
    if (atomicAdd(count, 1) != num_parts - 1) return false;
    *count = 0;  // every part has arrived: nothing else touches the count in this launch
    return true;
}

// Rows row0.. of o_part / lse_part (rows consecutive, part_stride parts each) merged into out (DIM outputs a
// row, the same rows): the nthreads threads tid = 0..nthreads-1 take (row, 4-dim chunk) items. The loads of a
// part do not wait on the math of the previous one (an online merge), so a thread's loads are in flight
// together: the merge costs about one round trip to L2 (ld.global.cg: parts come from other SMs).
template <int DIM, typename OUT_T>
__device__ __forceinline__ void merge_parts(OUT_T* out, const float* o_part, const float* lse_part, int rows,
                                            int num_parts, int part_stride, int tid, int nthreads) {
    constexpr int CHUNKS = DIM / 4;
#pragma unroll 4
    for (int item = tid; item < rows * CHUNKS; item += nthreads) {
        const int row = item / CHUNKS, chunk = item % CHUNKS;
        const float* lse = lse_part + row * part_stride;
        const float4* o = reinterpret_cast<const float4*>(o_part + row * part_stride * DIM) + chunk;
        float m = NEG_INF, den = 0.0f;
        float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int p = 0; p < num_parts; ++p) {
            const float l = __ldcg(lse + p);
            const float4 op = __ldcg(o + p * CHUNKS);
            if (l == NEG_INF) continue;  // a part with no keys
            const float m_new = fmaxf(m, l), rescale = exp2f(m - m_new), w = exp2f(l - m_new);
            den = den * rescale + w;
            num = make_float4(num.x * rescale + w * op.x, num.y * rescale + w * op.y, num.z * rescale + w * op.z,
                              num.w * rescale + w * op.w);
            m = m_new;
        }
        const float inv = den > 0.0f ? 1.0f / den : 0.0f;
        OUT_T* dst = out + row * DIM + chunk * 4;
        dst[0] = from_float<OUT_T>(num.x * inv);
        dst[1] = from_float<OUT_T>(num.y * inv);
        dst[2] = from_float<OUT_T>(num.z * inv);
        dst[3] = from_float<OUT_T>(num.w * inv);
    }
}
