"""The OpenAI-compatible server over the engine (`barerl serve`, the `barerl[serve]` extra).

engine_loop (the engine stepped in its own thread, requests admitted between steps) · protocol (request
bodies in, OpenAI's error shape) · responses (response bodies and stream chunks out) · app (the Starlette
routes) · cli (`barerl serve`). Tool calls are read by `barerl.tokenizer.tool_calls`.
"""
