"""`barerl serve --model PATH`: one model behind the OpenAI API, with uvicorn (`pip install 'barerl[serve]'`).

Flags take `vllm serve`'s names where barerl has the setting: --served-model-name, --host, --port, --api-key,
and every engine option (`EngineConfig`'s fields: --max-model-len, --max-num-seqs, --gpu-memory-utilization,
--enforce-eager, ...). --device and --dtype default to auto: the GPU in bf16 when CuPy finds one. The server
listens on 127.0.0.1 unless --host says otherwise.
"""

from __future__ import annotations

import argparse
import sys

from barerl.engine.cli_generate import add_dataclass_flags, given_fields
from barerl.engine.config import EngineConfig

_SKIP_ENGINE = {"device", "dtype"}  # resolved from "auto" here


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face model folder or .gguf file")
    parser.add_argument("--served-model-name", help="the model name clients ask for (default: --model as given)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="default 8000")
    parser.add_argument("--api-key", help="require this key as a bearer token on /v1 requests")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    add_dataclass_flags(parser.add_argument_group("engine"), EngineConfig, _SKIP_ENGINE)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from barerl.serve.app import build_app
    except ImportError as e:
        print(f"barerl serve needs the serve extra ({e.name} is missing): pip install 'barerl[serve]'",
              file=sys.stderr)
        return 1
    from barerl.device import resolve_auto_dtype, resolve_device
    from barerl.engine.llm import LLM

    device = resolve_device(args.device)
    llm = LLM(args.model, device=device, dtype=resolve_auto_dtype(args.dtype, device),
              **given_fields(args, EngineConfig, _SKIP_ENGINE))
    app = build_app(llm, args.served_model_name or args.model, args.api_key)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
