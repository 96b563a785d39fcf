// Packed sequences: which sequence a packed token belongs to.
#pragma once

// The sequence owning packed token t: the last s with cu_seqlens[s] <= t (cu_seqlens has num_seqs + 1 entries).
__device__ __forceinline__ int sequence_of(const int* cu_seqlens, int num_seqs, int t) {
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}
