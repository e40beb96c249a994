"""TokenizerBuild: trains the repository's own small tokenizer, ``models/llmfleet-tiny-tokenizer/``.

``python -m engine_sim.tokenizer_build [--out DIR] [--from-docs] [--check]``. A byte-level BPE (GPT-2's
pre-tokenizer and byte alphabet) trained with ``tokenizers``' own ``BpeTrainer`` on the corpus kept in the
folder (`CORPUS_FILE`: five of the repository's docs, `CORPUS_DOCS`, frozen so that later edits to docs/ do
not change the tokenizer; ``--from-docs`` retakes them), plus the simulator's filler words, each repeated
`_FILLER_REPEATS` times so that every one is a single token (`engine_sim.tokenizer.FileTokenizer` refuses a
tokenizer where one is not). Special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``; a ChatML
chat template in ``tokenizer_config.json`` with ``eos_token`` ``<|im_end|>`` and no BOS.

The output is reproducible: the same corpus gives the same bytes (the trainer is deterministic; the config is
written with sorted keys). ``--check`` builds in memory and exits 1 when the files in the folder differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from engine_sim.tokenizer import FILLER_WORDS

__all__ = ["CHAT_TEMPLATE", "DEFAULT_OUT", "SPECIAL_TOKENS", "VOCAB_SIZE", "build_files", "main"]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "models" / "llmfleet-tiny-tokenizer"
CORPUS_FILE = "corpus.txt"  # in the output folder: the training text, frozen with the tokenizer
# The trainer's cap; merges seen fewer than twice are not made, so this corpus gives about 4,250 tokens.
VOCAB_SIZE = 6000
CORPUS_DOCS = ("agent.md", "architecture.md", "engine-simulator.md", "gateway.md", "security.md")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_FILLER_REPEATS = 200
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus_from_docs(docs: Path) -> str:
    """The training text: `CORPUS_DOCS` in that order (how `CORPUS_FILE` was made)."""
    return "".join((docs / name).read_text(encoding="utf-8") for name in CORPUS_DOCS)


def _train(corpus: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    fillers = "".join(FILLER_WORDS) * _FILLER_REPEATS
    tokenizer.train_from_iterator([*corpus.splitlines(keepends=True), fillers], trainer=trainer)
    return tokenizer


def build_files(corpus: str) -> dict[str, bytes]:
    """The folder's files (name -> bytes) trained on ``corpus``."""
    tokenizer_json = _train(corpus).to_str(pretty=False)
    config = {
        "add_bos_token": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return {
        "tokenizer.json": (tokenizer_json + "\n").encode(),
        "tokenizer_config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
        CORPUS_FILE: corpus.encode(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_sim.tokenizer_build", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--from-docs", action="store_true", help="retake the corpus from docs/*.md first")
    parser.add_argument("--check", action="store_true", help="exit 1 when the files in --out differ from a build")
    args = parser.parse_args(argv)
    corpus_path = args.out / CORPUS_FILE
    if args.from_docs or not corpus_path.exists():
        corpus = corpus_from_docs(ROOT / "docs")
    else:
        corpus = corpus_path.read_text(encoding="utf-8")
    files = build_files(corpus)
    if args.check:
        stale = sorted(
            n for n, data in files.items() if not (args.out / n).is_file() or (args.out / n).read_bytes() != data
        )
        for name in stale:
            print(f"{args.out / name}: differs from what the build gives", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out / name).write_bytes(data)
    print(f"wrote {', '.join(sorted(files))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
