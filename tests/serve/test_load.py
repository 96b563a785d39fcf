"""A bounded load test: 64 concurrent streaming clients send 192 chat requests in all to one server on
loopback. Every request must complete without error, the engine must batch requests of different clients
together, and the run reports requests/s and time to first token (printed; nothing is asserted on times)."""

import asyncio
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")

NUM_CLIENTS, NUM_REQUESTS, MAX_TOKENS = 64, 192, 16


async def one_request(client, i):
    start, first = time.perf_counter(), None
    stream = await client.chat.completions.create(
        model="tiny-chat", messages=[{"role": "user", "content": f"Request {i}: say anything."}],
        max_tokens=MAX_TOKENS, temperature=1.0, seed=i, stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.delta.content and first is None:
                first = time.perf_counter()
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return (first or time.perf_counter()) - start, finish, usage.completion_tokens


async def run_clients(base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    queue = asyncio.Queue()
    for i in range(NUM_REQUESTS):
        queue.put_nowait(i)
    results = []

    async def worker():
        while not queue.empty():
            results.append(await one_request(client, queue.get_nowait()))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(NUM_CLIENTS)))
    elapsed = time.perf_counter() - start
    await client.close()
    return results, elapsed


def test_64_concurrent_streaming_clients(chat_llm, openai_server, capsys):
    llm = chat_llm(max_num_seqs=64)
    schedule, batch_sizes = llm.engine.scheduler.schedule, []

    def recording_schedule(*args, **kwargs):
        batch = schedule(*args, **kwargs)
        batch_sizes.append(len(batch.seqs))
        return batch

    llm.engine.scheduler.schedule = recording_schedule
    with openai_server(llm) as url:
        results, elapsed = asyncio.run(run_clients(url))
    ttft = np.array([r[0] for r in results])
    assert len(results) == NUM_REQUESTS
    assert all(finish in ("stop", "length") for _, finish, _ in results)
    assert all(1 <= n <= MAX_TOKENS for _, _, n in results)
    assert max(batch_sizes) > 1  # requests of different clients shared steps
    with capsys.disabled():
        print(f"\nload test: {NUM_REQUESTS} streamed chat requests from {NUM_CLIENTS} concurrent clients in "
              f"{elapsed:.2f} s: {NUM_REQUESTS / elapsed:.1f} requests/s, "
              f"{sum(r[2] for r in results) / elapsed:.0f} new tok/s; time to first token p50 "
              f"{np.median(ttft) * 1e3:.0f} ms, p90 {np.percentile(ttft, 90) * 1e3:.0f} ms, max "
              f"{ttft.max() * 1e3:.0f} ms; largest engine batch {max(batch_sizes)} sequences")
