"""Load any model through one function: a built-in name, an HF hub id, a local HF directory or a .gguf file."""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.models.catalog import BUILTIN_MODELS, model_gguf
from engine.config import AUTO
from engine.models import devices
from engine.models.auto import plan_precisions
from engine.models.int4_weight import quantize_int4
from engine.models.int8_weight import quantize_int8_weight
from engine.errors import IncompatiblePairError, MissingDependencyError, UnknownModelError
from engine.precision import precision as record
from engine.backends.contract import Backend, Runner
from engine.backends.llama_cpp import GGUF, GgufModel, GgufSettings
from engine.models.gguf_meta import gguf_config, gguf_tokenizer
from engine.models.sources import gguf_file, gguf_model, resolve_source

END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model as one value: what ``load_model`` (or ``wrap_model``) made, never changed after."""
    name: str
    precision: str
    backend: Backend  # what runs it: makes its runners, says what it is (engine/backends)
    config: object  # the transformers config: the model's sizes (layers, heads, vocabulary), for every backend
    tokenizer: object
    vocab_size: int  # tokenizer vocabulary; logits beyond it are padding rows
    eos_ids: frozenset[int]
    context_window: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    auto_precision: bool = False  # the precision was chosen by ``auto`` for this machine
    model: torch.nn.Module | None = None  # the transformers model where torch runs it (HF generate, hooks, copies)


def runner_for(loaded: LoadedModel, context_ids: list[int] | None = None) -> Runner:
    """A runner on ``loaded``'s model: the one way a decode, a proposer, a load-time check, the judge or a bench
    gets one. It may hold tokens (a llama.cpp context from the model's pool keeps what its last runner left): a decoder
    passes its prompt as ``context_ids`` (the pool gives the context holding most of it) and calls ``resume``, which
    keeps only what is still valid for its context; a caller that needs an empty cache passes none and calls
    ``reset``."""
    return loaded.backend.runner(loaded.vocab_size, context_ids)


def runner_name(loaded: LoadedModel) -> str:
    """What runs ``loaded``, in words: llama.cpp and its settings, or torch and its attention."""
    return loaded.backend.describe()


def quiet_library_logs() -> None:
    """Silence the library warnings that say nothing to a user of this app; called by the command-line
    entry points (launch.py, the bench), never at import. Calling it again changes nothing."""
    # bitsandbytes int8 on CPU warns on every matmul; the cast it announces is expected
    warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast")
    # int8-dynamic (the CPU draft) is made with torch.ao.quantization, which announces its deprecation
    warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated")
    warnings.filterwarnings("ignore", message="For migrations of users")
    warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)


def default_device() -> torch.device:
    return devices.default_device()


def attention_for(device: torch.device) -> str:
    """Row-exact attention on CPU (engine/models/attention.py): each query row of a verify forward is computed
    exactly as that token fed alone, so a batch-invariant precision keeps the greedy loop bit-for-bit the target's
    (``eager`` sums a verify row's weights times V in another order, ``sdpa`` differs by a bf16 step too). GPUs keep
    sdpa: their kernels are not batch-invariant anyway."""
    if device.type != "cpu":
        return "sdpa"
    from engine.models.attention import ROW_EXACT  # registers it with transformers

    return ROW_EXACT


def _dtype(precision: str) -> torch.dtype:
    """The torch dtype a precision's record names."""
    return getattr(torch, record(precision).dtype)


def _quantization_kwargs(precision: str, device: torch.device) -> dict:
    if record(precision).package != "bitsandbytes":  # int8-dynamic, int8-weight, int4: quantised after loading
        kwargs = {"dtype": _dtype(precision)}
        if device.type == "cuda":
            kwargs["device_map"] = {"": device.index or 0}  # straight onto the GPU, no full copy in CPU memory
        return kwargs
    from transformers import BitsAndBytesConfig
    devices.require_bitsandbytes(precision)
    compute = _dtype(devices.half_precision(device))  # fp16 on GPUs without bf16
    if precision == "int8":
        config = BitsAndBytesConfig(load_in_8bit=True)
    else:
        config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
    return {"quantization_config": config, "dtype": compute, "device_map": {"": device.index or 0}
            if device.type == "cuda" else {"": "cpu"}}


def load_model(name: str, precision: str | None = None, device: torch.device | None = None,
               role: str = "target", cache_dir: Path | None = None, chosen_by_auto: bool = False) -> LoadedModel:
    """Load ``name`` at ``precision`` (engine/precision.py, or ``auto``); converted weights live in ``cache_dir`` (see
    :func:`resolve_source`). Raises UnknownModelError with the built-in names. ``chosen_by_auto``: ``precision``
    is what ``auto`` resolved to in a plan made for the pair (the model's ``auto_precision`` says so)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    auto = chosen_by_auto or precision in (None, AUTO)
    precision = plan_precisions({role: (name, precision)}, device, cache_dir).precisions[role]
    if precision == GGUF:
        return load_gguf(name, cache_dir, auto)
    source = resolve_source(name, cache_dir)
    kwargs = _quantization_kwargs(precision, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation=attention_for(device), **kwargs)
        if "device_map" not in kwargs:  # the CPU's, and MPS's: loaded, then moved
            model = model.to(device)
    except ImportError as err:  # transformers' check of bitsandbytes (missing, or too old for this torch)
        raise MissingDependencyError(f"{precision} cannot load: {str(err).splitlines()[0]}") from err
    except (OSError, ValueError) as err:
        raise UnknownModelError(f"could not load {name!r}: {str(err).splitlines()[0]}. "
                                f"Built-in models: {', '.join(BUILTIN_MODELS)}") from err
    except RuntimeError as err:
        if not devices.is_out_of_memory(err):
            raise
        size = devices.model_size(source)
        raise devices.out_of_memory(f"loading {name} in {precision}", [(name, size.bytes(precision))], device,
                                    f"Choose nf4 (about {devices.gb(size.bytes('nf4'))}) or a smaller model.") from err
    if precision == "int8-dynamic":  # in place: a copy would double the fp32 peak
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    if precision == "int8-weight":
        model = quantize_int8_weight(model)
    if precision == "int4":  # a GGUF's own Q4_K/Q4_1 grid where it has one (engine/models/int4_weight.py)
        quantize_int4(model, model_gguf(name, cache_dir), requantize=role == "draft")
    model.eval()
    return wrap_model(name, precision, model, tokenizer, auto_precision=auto)


def load_gguf(name: str, cache_dir: Path | None = None, auto_precision: bool = False) -> LoadedModel:
    """``name``'s GGUF file run by llama.cpp; the tokenizer and config are read from the file's metadata, nothing
    converted (engine/models/gguf_meta.py: the chat template and the text-is-text encoding stay the HF tokenizer's,
    the same ids as llama.cpp's, tested)."""
    path = gguf_file(name, cache_dir)
    tokenizer = gguf_tokenizer(path, cache_dir)
    gguf = GgufModel(path)
    vocab = tokenizer.get_vocab()
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos.update(vocab[t] for t in END_TOKENS if t in vocab)
    return LoadedModel(name=name, precision=GGUF, backend=gguf,
                       config=gguf_config(path, cache_dir), tokenizer=tokenizer,
                       vocab_size=min(len(tokenizer), gguf.n_vocab), eos_ids=frozenset(eos),
                       context_window=gguf.n_ctx, device=torch.device("cpu"), auto_precision=auto_precision)


def with_gguf_settings(loaded: LoadedModel, settings: GgufSettings) -> LoadedModel:
    """``loaded``'s GGUF file run by llama.cpp with other ``settings`` (repacked weights, the KV cache's types): a new
    load of the same file; the tokenizer and config are the same objects."""
    return replace(loaded, backend=GgufModel(loaded.backend.path, settings))


def wrap_model(name: str, precision: str, model, tokenizer, auto_precision: bool = False) -> LoadedModel:
    """Describe an already-built transformers model, run by torch (used by tests with tiny random models too)."""
    from engine.backends.torch_runner import TorchBackend  # transformers, only once a model is loaded

    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    eos = set()
    for source in (getattr(tokenizer, "eos_token_id", None), model.generation_config.eos_token_id):
        eos.update(source if isinstance(source, (list, tuple)) else [source] if source is not None else [])
    eos.update(vocab[t] for t in END_TOKENS if t in vocab)
    vocab_size = len(tokenizer) if tokenizer is not None else model.config.vocab_size
    return LoadedModel(name=name, precision=precision, backend=TorchBackend(model), config=model.config,
                       tokenizer=tokenizer, model=model, vocab_size=min(vocab_size, _output_rows(model)),
                       eos_ids=frozenset(eos), context_window=int(getattr(model.config, "max_position_embeddings",
                                                                             4096)),
                       device=next(model.parameters()).device, auto_precision=auto_precision)


def _output_rows(model) -> int:
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or model.config.vocab_size)


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft and target must share a vocabulary (padding rows beyond it are fine); the target's precision must
    keep the loop lossless."""
    devices.check_target_precision(target.precision)
    if target.vocab_size != draft.vocab_size:
        raise IncompatiblePairError(
            f"draft {draft.name!r} has a vocabulary of {draft.vocab_size} tokens, target {target.name!r} has "
            f"{target.vocab_size}; speculative decoding needs the same tokenizer")
    _check_same_vocab(target.name, target.tokenizer, draft.name, draft.tokenizer)


def check_pair_sources(target: str, draft: str, cache_dir: Path | None = None) -> None:
    """The pair check on tokenizers alone, before any weights load: a mismatch fails in about a second."""
    _check_same_vocab(target, load_tokenizer(target, cache_dir), draft, load_tokenizer(draft, cache_dir))


def load_tokenizer(name: str, cache_dir: Path | None = None):
    """``name``'s tokenizer: a GGUF model's from the file's metadata (nothing converted), else from_pretrained's."""
    from transformers import AutoTokenizer

    if gguf_model(name):  # a built-in or a .gguf file; its own errors (a damaged GGUF's ModelFormatError) as they are
        return gguf_tokenizer(gguf_file(name, cache_dir), cache_dir)
    source = resolve_source(name, cache_dir)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise UnknownModelError(f"could not load the tokenizer of {name!r}: {str(err).splitlines()[0]}") from err


def _check_same_vocab(target_name: str, target_tokenizer, draft_name: str, draft_tokenizer) -> None:
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        differing = [tok for tok, i in t_vocab.items() if d_vocab.get(tok) != i]
        raise IncompatiblePairError(
            f"draft {draft_name!r} and target {target_name!r} tokenize differently: {len(differing)} tokens "
            f"map to other ids (e.g. {differing[:3]!r}); pick a draft from the target's model family")
