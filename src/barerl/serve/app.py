"""The OpenAI-compatible HTTP API over the engine: /v1/completions, /v1/chat/completions, /v1/models, /health.

Design decisions:
- Starlette, served by uvicorn (the `barerl[serve]` extra). Starlette is the well-kept ASGI toolkit that
  FastAPI is built on: routing, JSON and streaming responses and lifespan in one small package with no
  compiled parts. FastAPI's additions are pydantic request models and generated docs, but every field is
  validated here by hand anyway (`protocol`), to answer OpenAI's error shape with the field named, so they
  would be weight without use. uvicorn is the reference ASGI server (vLLM serves through it too).
- Concurrency: handlers run on the asyncio loop; the engine runs in its own thread (`EngineLoop`), which
  batches every request in flight, step by step. A handler validates its request, submits it and awaits its
  outputs on a queue, so any number of clients share the engine's continuous batching.
- Streaming is server-sent events as OpenAI sends them: one `data: {chunk}` event per choice and step, and
  `data: [DONE]` last; an error after the stream began (the status is sent already) is one `data: {"error":
  ...}` event before [DONE]. A client that goes away aborts its requests in the engine.
- Every error is answered in OpenAI's shape, never by a crashed server: 400 for bad JSON and bad fields,
  401 for a missing API key (when the server has one), 404 for an unknown model or route, 500 when an engine
  step fails (which fails the requests in the engine at that moment, not the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from barerl.serve.engine_loop import EngineLoop
from barerl.serve.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    check_model,
    parse_chat_request,
    parse_completion_request,
)
from barerl.serve.responses import (
    Sample,
    chat_delta,
    chat_finish_reason,
    chat_logprobs,
    chat_message,
    completion_choice,
    completion_logprobs,
    envelope,
    new_id,
    usage,
)


def build_app(llm, served_model_name: str, api_key: str | None = None) -> Starlette:
    """The ASGI app serving `llm` (an `LLM`) as `served_model_name`; requests must carry `api_key` as a
    bearer token when one is given. The engine thread runs while the app does (its lifespan)."""
    api = OpenAIServer(llm, served_model_name, api_key)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
    ]
    handlers = {APIError: _api_error, HTTPException: _http_error, Exception: _server_error}
    return Starlette(routes=routes, exception_handlers=handlers, lifespan=api.lifespan)


class OpenAIServer:
    def __init__(self, llm, served_model_name: str, api_key: str | None):
        self.llm, self.tokenizer = llm, llm.get_tokenizer()
        self.model_name, self.api_key = served_model_name, api_key
        self.engine = EngineLoop(llm)
        self.created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.engine.stop)

    # ------------------------------------------------------------------------------------------- routes

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> JSONResponse:
        self._authorize(request)
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "barerl",
                "max_model_len": self.llm.engine.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request: Request) -> Response:
        body = await self._body(request)
        check_model(body, self.model_name)
        req = parse_completion_request(body)
        prompts = [self._completion_prompt(p, req.add_special_tokens) for p in req.prompts]
        requests = self._make_requests(prompts, req)
        queue = self.engine.submit(requests)
        request_id, created = new_id("cmpl")
        if req.stream:
            return _event_stream(self._completion_chunks(queue, requests, req, request_id, created))
        samples = await self._gather(queue, requests, req.params.n)
        choices = [completion_choice(i * req.params.n + j, s.text, s, self._completion_logprobs(req, s))
                   for i, row in enumerate(samples) for j, s in enumerate(row)]
        return JSONResponse(envelope("text_completion", request_id, self.model_name, created, choices,
                                     _usage(requests, samples)))

    async def chat_completions(self, request: Request) -> Response:
        body = await self._body(request)
        check_model(body, self.model_name)
        req = parse_chat_request(body)
        requests = self._make_requests([self._chat_prompt(req)], req)
        queue = self.engine.submit(requests)
        request_id, created = new_id("chatcmpl")
        if req.stream:
            return _event_stream(self._chat_chunks(queue, requests, req, request_id, created))
        [samples] = await self._gather(queue, requests, req.params.n)
        choices = []
        for j, s in enumerate(samples):
            message, finish_reason = chat_message(s, req.parse_tool_calls)
            logprobs = chat_logprobs(self.tokenizer, s.token_ids, s.logprobs) if req.params.wants_logprobs else None
            choices.append({"index": j, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
                            "stop_reason": s.stop_reason})
        return JSONResponse(envelope("chat.completion", request_id, self.model_name, created, choices,
                                     _usage(requests, [samples])))

    # ------------------------------------------------------------------------------------------ streams

    async def _completion_chunks(self, queue, requests, req: CompletionRequest, request_id: str, created: int):
        n = req.params.n
        samples = [[Sample() for _ in range(n)] for _ in requests]
        async for i, delta in self._deltas(queue, requests):
            for out in delta.outputs:
                s = samples[i][out.index]
                offset = len(s.text)  # before this delta
                s.add(out)
                if not (out.text or out.token_ids or out.finished()):
                    continue
                piece = Sample(out.text, out.token_ids, out.logprobs or [], out.finish_reason, out.stop_reason)
                logprobs = self._completion_logprobs(req, piece, offset)
                choice = completion_choice(i * n + out.index, out.text, piece, logprobs)
                yield envelope("text_completion", request_id, self.model_name, created, [choice])
        if req.include_usage:
            yield envelope("text_completion", request_id, self.model_name, created, [], _usage(requests, samples))

    async def _chat_chunks(self, queue, requests, req: ChatRequest, request_id: str, created: int):
        def chunk(choices, used=None):
            return envelope("chat.completion.chunk", request_id, self.model_name, created, choices, used)

        samples = [Sample() for _ in range(req.params.n)]
        for j in range(req.params.n):
            yield chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
        async for _, delta in self._deltas(queue, requests):
            for out in delta.outputs:
                s = samples[out.index]
                s.add(out)
                message_delta = chat_delta(s, out.text, req.parse_tool_calls)
                if not (message_delta or out.token_ids or out.finished()):
                    continue
                logprobs = chat_logprobs(self.tokenizer, out.token_ids, out.logprobs or []) if (
                    req.params.wants_logprobs and out.token_ids) else None
                yield chunk([{"index": out.index, "delta": message_delta, "logprobs": logprobs,
                              "finish_reason": chat_finish_reason(s, req.parse_tool_calls),
                              "stop_reason": s.stop_reason}])
        if req.include_usage:
            yield chunk([], _usage(requests, [samples]))

    # ------------------------------------------------------------------------------------------ helpers

    async def _deltas(self, queue: asyncio.Queue, requests: list):
        """(request index, delta RequestOutput) until every request finished; the unfinished ones are aborted
        if the consumer stops early (a client gone, a cancelled handler)."""
        remaining = len(requests)
        try:
            while remaining:
                index, item = await queue.get()
                if isinstance(item, Exception):
                    raise APIError(f"the engine failed: {type(item).__name__}: {item}", status=500)
                remaining -= item.finished
                yield index, item
        finally:
            if remaining:
                self.engine.abort(requests)

    async def _gather(self, queue: asyncio.Queue, requests: list, n: int) -> list[list[Sample]]:
        samples = [[Sample() for _ in range(n)] for _ in requests]
        async for i, delta in self._deltas(queue, requests):
            for out in delta.outputs:
                samples[i][out.index].add(out)
        return samples

    async def _body(self, request: Request) -> dict:
        self._authorize(request)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    def _authorize(self, request: Request) -> None:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            raise APIError("a valid API key is needed (Authorization: Bearer KEY)", status=401,
                           code="invalid_api_key")

    def _completion_prompt(self, prompt, add_special_tokens: bool) -> dict:
        if not isinstance(prompt, str):
            return {"prompt_token_ids": prompt}
        if self.tokenizer is None:
            raise APIError("prompt: a text prompt needs a tokenizer; this model has none (send token ids)",
                           param="prompt")
        return {"prompt": prompt, "prompt_token_ids": self.tokenizer.encode(prompt, add_special_tokens)}

    def _chat_prompt(self, req: ChatRequest) -> dict:
        """The conversation in the model's chat template, as `LLM.chat` renders and encodes it."""
        if self.tokenizer is None:
            raise APIError("chat completions need a tokenizer with a chat template; this model has none")
        try:
            text = self.tokenizer.apply_chat_template(
                req.messages, add_generation_prompt=req.add_generation_prompt, tokenize=False, tools=req.tools,
                **req.chat_template_kwargs)
        except (ValueError, TypeError) as e:
            raise APIError(f"messages: the chat template failed: {e}", param="messages") from None
        return {"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)}

    def _make_requests(self, prompts: list[dict], req: CompletionRequest | ChatRequest) -> list:
        max_model_len, max_tokens = self.llm.engine.max_model_len, req.params.max_tokens
        for prompt in prompts:
            num_tokens = len(prompt["prompt_token_ids"])
            if num_tokens + (max_tokens or 1) > max_model_len:
                asked = f" and max_tokens={max_tokens}" if max_tokens else ""
                raise APIError(f"the prompt has {num_tokens} tokens{asked}: more than this model's context of "
                               f"{max_model_len} tokens", param="max_tokens" if max_tokens else "messages",
                               code="context_length_exceeded")
        try:
            return self.engine.make_requests(prompts, req.params)
        except (ValueError, TypeError) as e:  # "request 1: ...": the prompt's index, for several prompts
            message = re.sub(r"^request (\d+): ", lambda m: f"prompt {m.group(1)}: " * (len(prompts) > 1), str(e))
            raise APIError(message) from None

    def _completion_logprobs(self, req: CompletionRequest, sample: Sample, offset: int = 0) -> dict | None:
        if not req.params.wants_logprobs:
            return None
        return completion_logprobs(self.tokenizer, sample.token_ids, sample.logprobs, offset)


def _usage(requests: list, samples: list[list[Sample]]) -> dict:
    return usage(sum(len(r.prompt_token_ids) for r in requests),
                 sum(len(s.token_ids) for row in samples for s in row), sum(r.num_cached_tokens for r in requests))


def _event_stream(events) -> StreamingResponse:
    async def body():
        try:
            async for event in events:
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        except APIError as e:
            yield f"data: {json.dumps(e.body(), ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return JSONResponse(APIError(str(exc.detail), status=exc.status_code).body(), status_code=exc.status_code)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(APIError(f"internal error: {type(exc).__name__}: {exc}", status=500).body(),
                        status_code=500)
