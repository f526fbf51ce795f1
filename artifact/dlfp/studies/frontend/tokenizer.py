"""A Qwen-form tokenizer and a tiny Qwen3 model directory for ``vllm serve``, built offline.

Qwen2/Qwen3's ``tokenizer.json`` is a byte-level BPE: a regex split (``SPLIT_PATTERN``, as in Qwen2's tokenizer)
then byte-level mapping, 151,643 regular tokens and the ChatML special tokens. No tokenizer can be downloaded
here, so one of the same form and size is trained on the Python standard library's sources (a corpus every
machine with this Python has; its sha256 is recorded). Encoding and incremental decoding cost per token depend on
the algorithm and the pre-tokenizer, not on which merges were learnt, so the front-end costs measured with it stand
for Qwen3's (an inference: the merges differ, so a text's token count does too; costs are fitted per token).

``CHAT_TEMPLATE`` is ChatML as Qwen3's template renders a plain user turn (``<|im_start|>user ...<|im_end|>``,
then the assistant prefix); Qwen3's own template also walks tools and reasoning blocks, so its render costs at
least this much.
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

#: Qwen2's pre-tokenizer split pattern (``tokenizer.json`` of the Qwen2/Qwen3 releases).
SPLIT_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
#: Regular tokens of Qwen2/Qwen3's tokenizer (ids below ``<|endoftext|>`` = 151,643).
VOCAB_SIZE = 151_643
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
                 "{{- '<|im_start|>assistant\\n' }}{%- endif %}")
#: The tiny Qwen3 served (``dlfp/models/hf/qwen3-tiny``'s shape); its vocabulary is the tokenizer's.
TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 512, "intermediate_size": 1536,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_scaling": None, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 4, "initializer_range": 0.02,
    "use_cache": True, "torch_dtype": "float32",
}


def corpus_files() -> list[Path]:
    """The standard library's ``.py`` files (without ``site-packages``), sorted."""
    std = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in std.rglob("*.py") if "site-packages" not in p.parts)


def _texts(files: list[Path], digest) -> "iter":
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest.update(text.encode())
        yield text


def build_model_dir(out: Path, vocab_size: int = VOCAB_SIZE) -> dict:
    """Train the tokenizer and write ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and
    ``corpus.json`` into ``out`` (created). Returns ``corpus.json``'s content. Kept when ``corpus.json`` exists.

    About 30 s on one core of a 2-core VM.
    """
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "corpus.json"
    if meta_path.is_file():
        return json.loads(meta_path.read_text())
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size + len(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(SPECIAL_TOKENS))
    files, digest = corpus_files(), hashlib.sha256()
    tok.train_from_iterator(_texts(files, digest), trainer)
    tok.save(str(out / "tokenizer.json"))
    n = tok.get_vocab_size()
    eos = tok.token_to_id("<|im_end|>")
    (out / "config.json").write_text(json.dumps({**TINY_CONFIG, "vocab_size": n, "bos_token_id": None,
                                                 "eos_token_id": eos}, indent=1))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 32768, "clean_up_tokenization_spaces": False}, indent=1))
    meta = {"corpus": "python stdlib *.py", "files": len(files), "sha256": digest.hexdigest(), "vocab": n}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta
