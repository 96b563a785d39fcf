"""CudaGraphRunner: decode steps replayed from CUDA graphs give the eager runner's tokens and log-probs.

The engine runs a tiny Qwen3 on the GPU twice, with enforce_eager (ModelRunner) and without (the graph
runner); batches of 1..7 sequences land in padded buckets (1, 2, 4, 8), samples share prompt
blocks (copy-on-write), and the engine sleeps and wakes in between (the cache returns at its address and the
graphs are kept). With
lookahead (num_scheduler_steps=4) a graph holds four decode steps: the tokens must still be the eager
single steps' tokens.
"""

import numpy as np
import pytest

from barerl.engine.cuda_graph_runner import batch_buckets


def test_batch_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(1) == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [1, 4, 16])
def test_graph_decode_matches_eager(tiny_hf_model, tmp_path, steps):
    cupy = pytest.importorskip("cupy", reason="needs cupy and a CUDA GPU")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA GPU")
    from barerl.engine.cuda_graph_runner import CudaGraphRunner
    from barerl.engine.llm import LLM
    from barerl.engine.sampling_params import SamplingParams
    from barerl.model.model import Model

    folder, _ = tiny_hf_model("qwen3", tmp_path)
    model = Model.from_pretrained(folder, device="cuda", dtype="float32")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 96, n).tolist() for n in (3, 17, 40, 5, 9)]
    requests = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=True),
                SamplingParams(n=2, temperature=1.0, top_p=0.9, seed=3, max_tokens=30, ignore_eos=True,
                               logprobs=True)]

    def generate(graphs: bool, num_steps: int):
        llm = LLM(model, max_num_seqs=8, num_kv_blocks=64, max_model_len=128, enforce_eager=not graphs,
                  num_scheduler_steps=num_steps)
        assert isinstance(llm.engine.runner, CudaGraphRunner) == graphs
        results = []
        for params in requests:
            results += [o for r in llm.generate(prompts, params, use_tqdm=False) for o in r.outputs]
            if graphs:
                assert llm.engine.runner.graphs and {b for b, _ in llm.engine.runner.graphs} <= {1, 2, 4, 8}
                assert {k for _, k in llm.engine.runner.graphs} <= {1, num_steps}
                assert num_steps == 1 or any(k == num_steps for _, k in llm.engine.runner.graphs)
            captured = dict(llm.engine.runner.graphs) if graphs else {}
            llm.sleep()  # the cache's memory goes back to the driver, its address stays reserved
            llm.wake()
            if graphs:  # the cache is back at its address: the graphs are kept, nothing is captured again
                assert llm.engine.runner._kv_memory is not None, "no fixed-address KV cache on this driver"
                assert llm.engine.runner.graphs == captured
        return results

    eager, graphed = generate(False, 1), generate(True, steps)
    assert len(eager) == len(graphed)
    for e, g in zip(eager, graphed, strict=True):
        assert g.token_ids == e.token_ids
        np.testing.assert_allclose(g.logprobs, e.logprobs, atol=1e-4)
