"""Counter-based random bits (splitmix64's finaliser): a pure function of (seed, key), so a value is
reproducible anywhere (any device, any order, after a resume) with no generator state. The sampler's per-row
draw, the optimizer's stochastic rounding and LoRA's dropout use it; the kernels' twin is `splitmix64` in
csrc/common.cuh.

    x = seed + 0x9E3779B97F4A7C15 * key;  z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB;  z ^= z >> 31            (uint64, wrapping)
"""

from __future__ import annotations

from barerl.ops.common import xp_of

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def splitmix64(seed, key):
    """64 random bits per element of key (uint64 array); seed broadcasts against key."""
    xp = xp_of(key)
    u64 = xp.uint64
    x = xp.asarray(seed).astype(u64) + u64(_GOLDEN) * key.astype(u64, copy=False)
    z = (x ^ (x >> u64(30))) * u64(_MIX1)
    z = (z ^ (z >> u64(27))) * u64(_MIX2)
    return z ^ (z >> u64(31))

