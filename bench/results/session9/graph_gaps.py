"""What a kernel boundary costs inside a CUDA graph on this GPU: N back-to-back launches of an empty kernel
(1 CTA, and 512 / 2048 CTAs of 128 threads as G1's / G2's decode attention has), and of a kernel that reads one
fp32 per thread and writes it back (dependent on the previous launch through memory), captured and replayed.
A G1 decode step launches ~9 kernels per layer x 28 layers plus the LM head and sampler (~260).

    PYTHONPATH=src:bench python bench/results/session9/graph_gaps.py
"""

import cupy
import numpy as np

SOURCE = r"""
extern "C" __global__ void empty() {}
extern "C" __global__ void touch(float* x) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = x[i] + 1.0f;
}
"""


def per_launch_us(launch, count: int = 1000, repeat: int = 5) -> float:
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        launch()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(count):
            launch()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(repeat):
            start, end = stream.record(), None
            graph.launch(stream)
            end = stream.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / count)
    return float(np.median(times))


def main() -> None:
    module = cupy.RawModule(code=SOURCE)
    empty, touch = module.get_function("empty"), module.get_function("touch")
    x = cupy.zeros(2048 * 128, np.float32)
    for ctas in (1, 512, 2048):
        print(f"empty kernel, {ctas:4d} CTAs x 128: {per_launch_us(lambda c=ctas: empty((c,), (128,), ())):5.2f} us "
              f"per launch in a graph", flush=True)
        print(f"read+write kernel, {ctas:4d} CTAs x 128: "
              f"{per_launch_us(lambda c=ctas: touch((c,), (128,), (x,))):5.2f} us per launch in a graph", flush=True)


if __name__ == "__main__":
    main()
