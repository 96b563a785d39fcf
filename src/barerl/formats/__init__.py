"""File formats, below every other package: what model weights, tokenizers and training state are stored in.

- `safetensors`: our reader (memory-mapped, validated header) and writer, with bf16.
- `gguf` (+ `gguf_names`, `gguf_quants`): llama.cpp's files read into Hugging Face names, shapes and config.
- `hf_folder`: a Hugging Face model folder's files (config.json, single or sharded safetensors).
- `paths`: what a model path names (a folder, a .gguf file, a file inside an installed package).
- `atomic`: one atomic folder writer, for model checkpoints and training checkpoints alike.
- `checksums`: the size and SHA-256 of every file of a checkpoint, recorded when written, verified when read.

Nothing here knows the model's buffers: readers give names and arrays, writers take them.
"""


class CheckpointError(ValueError):
    """A model's files are missing, corrupt, or do not match its config."""
