"""The engine driven step by step for a server: one thread owns the `LLM`, admits requests between steps
and hands each request's new tokens and text to the asyncio queue of the HTTP request that asked.

It drives `engine.Engine`'s step loop directly (`new_request`, `add`, `step`, `output`, `abort`, `clear`), as
`LLM.generate` does for one batch, but with requests coming and going between steps.

Design decisions:
- One thread owns the engine, which is not thread-safe. HTTP handlers (on the asyncio loop) only validate
  requests (`make_requests`) and enqueue them (`submit`, `abort`) under a lock; the engine thread takes what
  waits after each step, so a request that arrives mid-step joins the running batch at the next one
  (continuous batching) and never waits for the others to finish.
- The prefix cache: `LLM.generate` resets it at the start of every call because a trainer may have changed
  the weights in place since the last one. A server holds its weights fixed, so the cache is reset once,
  when the loop starts, and then kept across requests: a system prompt shared by many requests is computed
  once. Whoever changes the weights of a served model calls `reset_prefix_cache()`, which runs between steps.
- Outputs: after each step, every request that got tokens gets one delta `RequestOutput` (per sample: the
  new token ids, log-probs and text, text that may still become a stop string held back), as `LLM.stream`
  yields them; the last one has `finished` set.
- Aborts (a client that went away) finish the request's sequences between steps, freeing their blocks, as a
  stop string does; tokens of an already launched lookahead step for them are dropped by the scheduler.
- Errors: a step that raises fails every request in the engine (each queue gets the exception), the engine
  is cleared and the loop goes on serving new requests.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from barerl.engine.outputs import RequestOutput
from barerl.engine.sampling_params import SamplingParams
from barerl.engine.sequence import Request


@dataclass
class _Active:
    """A request in the engine and where its outputs go: (index, RequestOutput | Exception) items."""

    request: Request
    index: int  # its position among the requests of one HTTP call
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    num_sent: dict[int, int] = field(default_factory=dict)  # seq_id -> tokens already sent

    def send(self, item: RequestOutput | Exception) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, item))
        except RuntimeError:  # the event loop is closed: nobody listens any more
            pass


class EngineLoop:
    def __init__(self, llm):
        self.llm, self.engine = llm, llm.engine
        self._wakeup = threading.Condition()
        self._incoming: list[_Active] = []
        self._aborts: list[int] = []
        self._reset_cache = False
        self._stopping = False
        self._active: dict[int, _Active] = {}  # request_id -> entry; touched by the engine thread only
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------ called by handlers

    def make_requests(self, prompts: list[dict], params: SamplingParams) -> list[Request]:
        """Validated engine requests for {"prompt", "prompt_token_ids"} dicts (ValueError / TypeError name the
        prompt's index, "request i: ..."); nothing is queued yet, and nothing is built unless all are valid."""
        for i, prompt in enumerate(prompts):
            try:
                self.engine.validate(prompt["prompt_token_ids"], params)
            except (ValueError, TypeError) as e:
                raise type(e)(f"request {i}: {e}") from None
        with self._wakeup:  # the engine's request counter and seed generator
            return [self.engine.new_request(p.get("prompt"), p["prompt_token_ids"], params) for p in prompts]

    def submit(self, requests: list[Request]) -> asyncio.Queue:
        """Queue requests for the engine; their outputs arrive on the returned queue as (index, output)."""
        queue, loop = asyncio.Queue(), asyncio.get_running_loop()
        with self._wakeup:
            self._incoming += [_Active(r, i, queue, loop) for i, r in enumerate(requests)]
            self._wakeup.notify()
        return queue

    def abort(self, requests: list[Request]) -> None:
        with self._wakeup:
            self._aborts += [r.request_id for r in requests]
            self._wakeup.notify()

    def reset_prefix_cache(self) -> None:
        with self._wakeup:
            self._reset_cache = True
            self._wakeup.notify()

    # ---------------------------------------------------------------------------------------- lifetime

    def start(self) -> None:
        if self.llm.asleep:
            raise RuntimeError("the engine is asleep (its KV cache is released): call llm.wake() first")
        self.engine.clear()
        self._thread = threading.Thread(target=self._run, name="barerl-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ----------------------------------------------------------------------------------- engine thread

    def _has_work(self) -> bool:
        return self.engine.has_unfinished()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not (self._stopping or self._incoming or self._aborts or self._reset_cache
                           or self._has_work()):
                    self._wakeup.wait()
                if self._stopping:
                    break
                incoming, aborts, reset = self._incoming, self._aborts, self._reset_cache
                self._incoming, self._aborts, self._reset_cache = [], [], False
            self._admit(incoming, aborts, reset)
            if not self._has_work():
                continue
            try:
                sampled = self.engine.step(incremental_text=True)
            except Exception as e:  # noqa: BLE001 -- every request in flight is told, and the server goes on
                self._fail_all(e)
                continue
            self._publish({s.request.request_id for s in sampled})
        self._fail_all(RuntimeError("the server is shutting down"))

    def _admit(self, incoming: list[_Active], aborts: list[int], reset: bool) -> None:
        for entry in incoming:
            self.engine.add(entry.request)
            self._active[entry.request.request_id] = entry
        for request_id in aborts:
            entry = self._active.pop(request_id, None)
            if entry is not None:
                self.engine.abort(entry.request)
        if reset:
            self.engine.block_manager.reset_prefix_cache()

    def _publish(self, request_ids: set[int]) -> None:
        for request_id in request_ids:
            entry = self._active.get(request_id)
            if entry is None:  # aborted
                continue
            entry.send(self.engine.output(entry.request, entry.num_sent))
            if entry.request.finished:
                del self._active[request_id]

    def _fail_all(self, error: Exception) -> None:
        for entry in self._active.values():
            entry.send(error)
        self._active.clear()
        self.engine.clear()
