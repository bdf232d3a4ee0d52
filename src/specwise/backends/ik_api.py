"""ctypes declarations of our own for the ik_llama.cpp library that the `ik-llama-cpp-python`
wheel ships (`ik_llama_cpp/lib/libllama.so`), or that `ik_native` builds for this CPU from the
same version's source, matching the `llama.h` shipped in the wheel; and which of the two this
process loads (`library_path`): the native build where it is installed here (`find`) and
`ik_native.compare` measured it faster (`verdict`, `preferred`), else the wheel's.

Only what `IkLlamaLM` and `requant` call is declared. The four structs passed to it
(`llama_batch`, `llama_model_params`, `llama_context_params`, `llama_model_quantize_params`)
must match the header field for field: a wrong
offset would hand the library garbage, so `tests/test_ik_llama.py` compiles the header's
`offsetof`/`sizeof` of every field declared here and compares. `open_library` loads the
library in this process and checks the defaults it returns; whether its kernels run on this
CPU at all is the probe's question (`specwise.backends.ik_llama`), never asked here. This
module does not import the wheel's Python package, only finds its files.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
from ctypes import (
    POINTER,
    c_bool,
    c_char_p,
    c_float,
    c_int,
    c_int8,
    c_int32,
    c_uint32,
    c_void_p,
)
from pathlib import Path
from types import SimpleNamespace

from specwise.machine import cpu_key
from specwise.models import home

__all__ = [
    "STRUCTS",
    "IkLibraryError",
    "eval_callback",
    "find",
    "forced_library",
    "header_path",
    "install_dir",
    "library_id",
    "library_path",
    "llama_batch",
    "llama_context_params",
    "llama_model_params",
    "llama_model_quantize_params",
    "open_ggml",
    "open_library",
    "preferred",
    "verdict",
]

WHEEL = "ik-llama-cpp-python"
WHEEL_VERSION = "0.1.5"  # the header these declarations match

llama_token = c_int32
llama_pos = c_int32
llama_seq_id = c_int32
_enum = c_int  # every C enum of the header (ggml_type, llama_*_type) is an int


class IkLibraryError(RuntimeError):
    """The ik_llama.cpp library is missing, does not load, or is not the one declared here."""


class llama_batch(ctypes.Structure):
    _fields_ = [
        ("n_tokens", c_int32),
        ("token", POINTER(llama_token)),
        ("embd", POINTER(c_float)),
        ("pos", POINTER(llama_pos)),
        ("n_seq_id", POINTER(c_int32)),
        ("seq_id", POINTER(POINTER(llama_seq_id))),
        ("logits", POINTER(c_int8)),
        ("all_pos_0", llama_pos),
        ("all_pos_1", llama_pos),
        ("all_seq_id", llama_seq_id),
    ]


class llama_model_params(ctypes.Structure):
    _fields_ = [
        ("devices", c_char_p),
        ("n_gpu_layers", c_int32),
        ("mla", c_int32),
        ("split_mode", _enum),
        ("main_gpu", c_int32),
        ("max_gpu", c_int32),
        ("ncmoe", c_int32),
        ("type_k", _enum),
        ("type_v", _enum),
        ("max_ctx_size", c_uint32),
        ("n_seq_max", c_int32),
        ("n_ubatch", c_int32),
        ("amb", c_int32),
        ("fit_margin", c_int32),
        ("fit", c_bool),
        ("worst_graph_tokens", c_int32),
        ("type_k_first", _enum),
        ("type_k_last", _enum),
        ("type_v_first", _enum),
        ("type_v_last", _enum),
        ("n_k_first", c_int32),
        ("n_k_last", c_int32),
        ("n_v_first", c_int32),
        ("n_v_last", c_int32),
        ("tensor_split", POINTER(c_float)),
        ("rpc_servers", c_char_p),
        ("progress_callback", c_void_p),
        ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p),
        ("tensor_buft_overrides", c_void_p),
        ("vocab_only", c_bool),
        ("use_mmap", c_bool),
        ("use_mlock", c_bool),
        ("check_tensors", c_bool),
        ("repack_tensors", c_bool),
        ("use_thp", c_bool),
        ("validate_quants", c_bool),
        ("merge_qkv", c_bool),
        ("merge_up_gate_exps", c_bool),
        ("mtp", c_bool),
        ("dry_run", c_bool),
        ("flash_attn", c_bool),
    ]


class llama_context_params(ctypes.Structure):
    _fields_ = [
        ("seed", c_uint32),
        ("n_ctx", c_uint32),
        ("n_batch", c_uint32),
        ("n_ubatch", c_uint32),
        ("n_seq_max", c_uint32),
        ("n_threads", c_uint32),
        ("n_threads_batch", c_uint32),
        ("max_extra_alloc", c_int32),
        ("worst_case_tokens", c_int32),
        ("rope_scaling_type", _enum),
        ("pooling_type", _enum),
        ("attention_type", _enum),
        ("rope_freq_base", c_float),
        ("rope_freq_scale", c_float),
        ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float),
        ("yarn_beta_fast", c_float),
        ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32),
        ("defrag_thold", c_float),
        ("cb_eval", c_void_p),
        ("cb_eval_user_data", c_void_p),
        ("type_k", _enum),
        ("type_v", _enum),
        ("type_reduce", _enum),
        ("type_k_first", _enum),
        ("type_k_last", _enum),
        ("type_v_first", _enum),
        ("type_v_last", _enum),
        ("n_k_first", c_int32),
        ("n_k_last", c_int32),
        ("n_v_first", c_int32),
        ("n_v_last", c_int32),
        ("logits_all", c_bool),
        ("embeddings", c_bool),
        ("offload_kqv", c_bool),
        ("flash_attn", c_bool),
        ("mla_attn", c_int),
        ("attn_max_batch", c_int),
        ("fused_moe_up_gate", c_bool),
        ("grouped_expert_routing", c_bool),
        ("fused_up_gate", c_bool),
        ("fused_mmad", c_bool),
        ("rope_cache", c_bool),
        ("graph_reuse", c_bool),
        ("min_experts", c_int),
        ("thresh_experts", c_float),
        ("only_active_experts", c_bool),
        ("k_cache_hadamard", c_bool),
        ("v_cache_hadamard", c_bool),
        ("split_mode_graph_scheduling", c_bool),
        ("scheduler_async", c_bool),
        ("mtp", c_bool),
        ("mtp_op_type", _enum),
        ("abort_callback", c_void_p),
        ("abort_callback_data", c_void_p),
        ("offload_policy", c_void_p),
        ("cuda_params", c_void_p),
    ]


class llama_model_quantize_params(ctypes.Structure):
    _fields_ = [
        ("nthread", c_int32),
        ("ftype", _enum),
        ("output_tensor_type", _enum),
        ("token_embedding_type", _enum),
        ("attn_q_type", _enum),
        ("attn_k_type", _enum),
        ("attn_v_type", _enum),
        ("attn_qkv_type", _enum),
        ("attn_output_type", _enum),
        ("ffn_gate_type", _enum),
        ("ffn_down_type", _enum),
        ("ffn_up_type", _enum),
        ("ffn_gate_inp_type", _enum),
        ("allow_requantize", c_bool),
        ("quantize_output_tensor", c_bool),
        ("only_copy", c_bool),
        ("pure", c_bool),
        ("keep_split", c_bool),
        ("ignore_imatrix_rules", c_bool),
        ("only_repack", c_bool),
        ("dry_run", c_bool),
        ("partial_requant", c_bool),
        ("imatrix", c_void_p),
        ("kv_overrides", c_void_p),
        ("custom_quants", c_void_p),
        ("repack_pattern", c_void_p),
    ]


STRUCTS = (llama_batch, llama_model_params, llama_context_params, llama_model_quantize_params)

log_callback = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
# ggml_backend_sched_eval_callback: (struct ggml_tensor *, ask, user data) -> go on / want it
eval_callback = ctypes.CFUNCTYPE(c_bool, c_void_p, c_bool, c_void_p)

_p = c_void_p  # opaque pointers: llama_model *, llama_context *, llama_vocab *
_PROTOTYPES: dict[str, tuple[object, list]] = {
    "llama_backend_init": (None, []),
    "llama_print_system_info": (c_char_p, []),
    "llama_log_set": (None, [log_callback, c_void_p]),
    "llama_model_default_params": (llama_model_params, []),
    "llama_context_default_params": (llama_context_params, []),
    "llama_model_load_from_file": (_p, [c_char_p, llama_model_params]),
    "llama_free_model": (None, [_p]),
    "llama_init_from_model": (_p, [_p, llama_context_params]),
    "llama_free": (None, [_p]),
    "llama_n_ctx_train": (c_int32, [_p]),
    "llama_model_n_embd": (c_int32, [_p]),
    "llama_n_layer": (c_int32, [_p]),
    "llama_model_get_vocab": (_p, [_p]),
    "llama_model_chat_template": (c_char_p, [_p, c_char_p]),
    "llama_vocab_n_tokens": (c_int32, [_p]),
    "llama_vocab_is_eog": (c_bool, [_p, llama_token]),
    "llama_vocab_bos": (llama_token, [_p]),
    "llama_vocab_eos": (llama_token, [_p]),
    "llama_vocab_get_text": (c_char_p, [_p, llama_token]),
    "llama_vocab_tokenize": (
        c_int32,
        [_p, c_char_p, c_int32, POINTER(llama_token), c_int32, c_bool, c_bool],
    ),
    "llama_detokenize": (
        c_int32,
        [_p, POINTER(llama_token), c_int32, c_char_p, c_int32, c_bool, c_bool],
    ),
    "llama_batch_init": (llama_batch, [c_int32, c_int32, c_int32]),
    "llama_batch_free": (None, [llama_batch]),
    "llama_decode": (c_int32, [_p, llama_batch]),
    "llama_get_logits": (POINTER(c_float), [_p]),
    "llama_kv_cache_seq_rm": (c_bool, [_p, llama_seq_id, llama_pos, llama_pos]),
    "llama_kv_cache_seq_cp": (None, [_p, llama_seq_id, llama_seq_id, llama_pos, llama_pos]),
    "llama_kv_cache_defrag": (None, [_p]),
    "llama_kv_cache_update": (c_int32, [_p]),
    "llama_model_quantize_default_params": (llama_model_quantize_params, []),
    "llama_model_quantize": (
        c_uint32,
        [c_char_p, c_char_p, POINTER(llama_model_quantize_params)],
    ),
}


# mainline llama.cpp's names for the same functions, so that code written against
# llama-cpp-python (the tokenizer, the shared forward) calls either library alike
_ALIASES = {
    "llama_model_free": "llama_free_model",
    "llama_model_n_ctx_train": "llama_n_ctx_train",
    "llama_model_n_layer": "llama_n_layer",
    "llama_tokenize": "llama_vocab_tokenize",
}


def _wheel_dir() -> Path:
    spec = importlib.util.find_spec("ik_llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise IkLibraryError(
            f"the ik_llama.cpp backend needs the {WHEEL}=={WHEEL_VERSION} wheel (x86-64 Linux, "
            f"CPython 3.11), which is not installed"
        )
    return Path(next(iter(spec.submodule_search_locations)))


LIBRARY_ENV = "SPECWISE_IK_LIBRARY"  # "wheel" or "native": load that library
LIBRARIES = ("libllama.so", "libggml.so")  # what is installed; libllama.so needs libggml.so
CHOICE = "choice.json"  # beside the build: which library `ik_native.compare` measured faster


def install_dir() -> Path:
    """Where `make native` installs this CPU's build (`ik_native.build`)."""
    return home() / "engines" / "ik_llama" / f"{WHEEL_VERSION}-{cpu_key()}"


def find() -> Path | None:
    """This machine's native libllama.so, or None where `make native` has not built one."""
    folder = install_dir()
    if all((folder / name).is_file() for name in LIBRARIES):
        return folder / LIBRARIES[0]
    return None


def verdict() -> dict | None:
    """What `ik_native.compare` decided for this machine's build (library, reason, curves,
    model), or None where it has not run since the build."""
    try:
        said = json.loads((install_dir() / CHOICE).read_text())
        said["curves"] = {w: {int(n): ms for n, ms in c.items()} for w, c in said["curves"].items()}
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return said


def preferred() -> Path | None:
    """This machine's native libllama.so where it is built and measured faster than the
    wheel's (`ik_native.compare`), else None."""
    found = find()
    said = verdict() if found is not None else None
    return found if said is not None and said.get("library") == "native" else None


def forced_library() -> str | None:
    """$SPECWISE_IK_LIBRARY: "wheel" or "native" where set, None where unset (then the
    measured verdict chooses). A value that cannot be honoured is the user's mistake, not a
    missing library: it raises ValueError (one sentence), so that no caller mistakes it for
    "ik_llama.cpp is not here" and quietly runs (and caches) mainline instead."""
    forced = os.environ.get(LIBRARY_ENV, "")
    if forced not in ("", "wheel", "native"):
        raise ValueError(f"{LIBRARY_ENV}={forced!r} is invalid; use wheel or native, or unset it")
    if forced == "native" and find() is None:
        raise ValueError(
            f"{LIBRARY_ENV}=native, but `make native` has built no library for this CPU; run "
            f"it, or unset {LIBRARY_ENV}"
        )
    return forced or None


def library_path() -> Path:
    """The libllama.so specwise loads: this CPU's native build where `make native` made one
    and measured it faster than the wheel's (`preferred`; built from the same
    version's source, so these declarations hold), else the wheel's; $SPECWISE_IK_LIBRARY
    forces one (`forced_library`: ValueError where it cannot). Raises IkLibraryError where the
    wheel's library is not there."""
    forced = forced_library()
    if forced != "wheel":
        native = find() if forced == "native" else preferred()
        if native is not None:
            return native
    path = _wheel_dir() / "lib" / "libllama.so"
    if not path.is_file():
        raise IkLibraryError(f"the {WHEEL} wheel is installed but has no {path}")
    return path


def library_id() -> str:
    """Identifies the installed library (path and file), for keys of cached verdicts."""
    from specwise.backends.base import file_fingerprint

    path = library_path()
    return f"{path}:{file_fingerprint(path)}"


def header_path() -> Path:
    """The llama.h shipped in the same wheel (for the layout test)."""
    from importlib.metadata import PackageNotFoundError, files

    try:
        found = [f for f in files(WHEEL) or () if f.name == "llama.h"]
    except PackageNotFoundError:
        raise IkLibraryError(f"the {WHEEL} wheel is not installed") from None
    if not found:
        raise IkLibraryError(f"the {WHEEL} wheel ships no llama.h")
    return Path(found[0].locate()).resolve()


def open_library(path: Path | None = None) -> SimpleNamespace:
    """Load libllama.so in this process with the prototypes above; the returned namespace
    carries each function under its C name (and mainline's name, `_ALIASES`), plus
    `llama_token` (the token type), `path` and `system_info`. Raises IkLibraryError where the
    library does not load or its defaults are not the ones the declared structs imply."""
    path = path or library_path()
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as exc:
        raise IkLibraryError(f"cannot load {path}: {exc}") from None
    lib = SimpleNamespace(path=path, llama_token=llama_token)
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            raise IkLibraryError(
                f"{path} has no function {name}: it is not the ik_llama.cpp library of "
                f"{WHEEL} {WHEEL_VERSION}"
            ) from None
        fn.restype, fn.argtypes = restype, argtypes
        setattr(lib, name, fn)
    for alias, name in _ALIASES.items():
        setattr(lib, alias, getattr(lib, name))
    _check_defaults(lib)
    lib.system_info = lib.llama_print_system_info().decode("utf-8", "replace")
    return lib


_GGML_PROTOTYPES: dict[str, tuple[object, list]] = {
    "ggml_get_name": (c_char_p, [c_void_p]),
    "ggml_nbytes": (ctypes.c_size_t, [c_void_p]),
    "ggml_backend_tensor_get": (None, [c_void_p, c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
}


def open_ggml(lib: SimpleNamespace) -> SimpleNamespace:
    """The ggml functions that read a tensor in an eval callback, from the libggml.so beside
    `lib`'s libllama.so (already loaded by it)."""
    path = Path(lib.path).parent / "libggml.so"
    try:
        cdll = ctypes.CDLL(str(path))
        fns = {name: getattr(cdll, name) for name in _GGML_PROTOTYPES}
    except (OSError, AttributeError) as exc:
        raise IkLibraryError(f"cannot read tensors through {path}: {exc}") from None
    for name, (restype, argtypes) in _GGML_PROTOTYPES.items():
        fns[name].restype, fns[name].argtypes = restype, argtypes
    return SimpleNamespace(**fns)


def _check_defaults(lib: SimpleNamespace) -> None:
    """The library's default parameters, read through our structs, must be the header's
    documented defaults: a struct of another layout reads other numbers."""
    m = lib.llama_model_default_params()
    c = lib.llama_context_default_params()
    q = lib.llama_model_quantize_default_params()
    seen = {  # fields at the start, middle and end of each struct
        "model.n_gpu_layers": m.n_gpu_layers >= 0,
        "model.n_ubatch": m.n_ubatch > 0,
        "model.n_k_first": m.n_k_first == -1,
        "model.use_mmap": m.use_mmap is True,
        "model.vocab_only": m.vocab_only is False,
        "context.n_batch": c.n_batch >= c.n_ubatch > 0,
        "context.n_seq_max": c.n_seq_max == 1,
        "context.yarn_ext_factor": c.yarn_ext_factor == -1.0,
        "context.defrag_thold": c.defrag_thold < 0,
        "context.n_v_last": c.n_v_last == -1,
        "context.embeddings": c.embeddings is False,
        "context.offload_kqv": c.offload_kqv is True,
        "context.mtp_op_type": c.mtp_op_type == 0,
        "quantize.nthread": q.nthread == 0,
        "quantize.quantize_output_tensor": q.quantize_output_tensor is True,
        "quantize.only_copy": q.only_copy is False,
        "quantize.repack_pattern": q.repack_pattern is None,
    }
    bad = [k for k, ok in seen.items() if not ok]
    if bad:
        raise IkLibraryError(
            f"the defaults of {lib.path} read wrong through specwise's declarations "
            f"({', '.join(bad)}): the library is not the one of {WHEEL} {WHEEL_VERSION}"
        )
