"""barerl: SFT and GRPO post-training of language models with no PyTorch."""

__version__ = "0.1.0"
