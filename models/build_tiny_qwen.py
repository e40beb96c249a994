"""Tiny Qwen2: build a small random-weight Qwen2 model around the repository's tokenizer, with no download.

Usage (in a venv with torch and transformers, e.g. the real-engine venv ``images/vllm-cpu.sh`` makes)::

    python models/build_tiny_qwen.py OUT_DIR

The model exists so the real vLLM can serve something on a CPU in CI: 2 layers, hidden 128, 4 attention heads of
32 (the CPU attention backend supports head sizes from 32 up), 2 KV heads, 4,096 positions, the tokenizer's exact
vocabulary, tied embeddings, bfloat16, saved as safetensors. Its weights come from a fixed seed, so every build
gives the same tensors and the same greedy answers; its text is noise. The folder holds ``tokenizer.json`` and
``tokenizer_config.json`` (with its ChatML ``chat_template``) copied from ``models/llmfleet-tiny-tokenizer``, so
chat, Responses and Messages render, and ``generation_config.json`` names ``<|im_end|>`` as the end of a turn.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

TOKENIZER = Path(__file__).resolve().parent / "llmfleet-tiny-tokenizer"
SEED = 0


def build(out: Path) -> dict[str, object]:
    """Write the model to ``out``; returns its facts (the stack's ``modelFacts`` and the weights' digest)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, out / name)
    tokenizer = AutoTokenizer.from_pretrained(out)
    if not tokenizer.chat_template:
        raise SystemExit(f"{TOKENIZER / 'tokenizer_config.json'}: no chat_template")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad).save_pretrained(out)
    weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    return {
        "out": str(out),
        "vocabSize": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "weightsSha256": weights,
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python models/build_tiny_qwen.py OUT_DIR")
    print(json.dumps(build(Path(sys.argv[1]))))
