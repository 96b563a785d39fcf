"""barerl: SFT and GRPO post-training of language models with no PyTorch."""

__version__ = "0.1.0"

_LAZY = {"LLM": "barerl.engine.llm", "SamplingParams": "barerl.engine.sampling_params"}


def __getattr__(name: str):
    """`barerl.LLM` and `barerl.SamplingParams`, imported on first use so that `import barerl` stays cheap."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'barerl' has no attribute {name!r}")
