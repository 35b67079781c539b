"""ctypes declarations of ``include/nerva.h`` and loading of ``libnerva_client.so``.

The structs mirror the header field by field (C ABI version 1); :func:`load` checks the
library's ``nerva_abi_version()`` against :data:`ABI_VERSION` so a mismatched library fails at
import rather than corrupting memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import List, Optional

ABI_VERSION = 1
EVENT_MAX_TOKENS = 16

# nerva_event_kind
EVENT_TOKENS = 1
EVENT_TOP_LOGPROBS = 2
EVENT_TEXT = 3
EVENT_DONE = 4
EVENT_ERROR = 5
EVENT_SHUTDOWN = 6

# nerva_finish_reason, by value
FINISH_REASONS = {
    0: "none",
    1: "stop",
    2: "length",
    3: "context_length",
    4: "cancelled",
    5: "error",
    6: "shutdown",
}

# nerva_status codes used by the Python layer
OK = 0
E_INVALID_ARGUMENT = -1
E_NO_DAEMON = -2
E_DAEMON_GONE = -7
E_RING_FULL = -8
E_TIMEOUT = -9
E_SHUTTING_DOWN = -10
E_REJECTED = -11
E_TOO_LARGE = -14
E_UNKNOWN_TAG = -15
E_CLOSED = -102


class nerva_generate_params(ctypes.Structure):
    _fields_ = [
        ("max_tokens", ctypes.c_uint32),
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_uint32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("repetition_penalty", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("frequency_penalty", ctypes.c_float),
        ("seed", ctypes.c_uint64),
        ("n_samples", ctypes.c_uint32),
        ("top_logprobs", ctypes.c_uint32),
        ("priority", ctypes.c_int32),
        ("ignore_eos", ctypes.c_bool),
        ("stream_tokens", ctypes.c_bool),
        ("stream_text", ctypes.c_bool),
        ("logprobs", ctypes.c_bool),
        ("stop_strings", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop_strings", ctypes.c_size_t),
        ("stop_token_ids", ctypes.POINTER(ctypes.c_uint32)),
        ("n_stop_token_ids", ctypes.c_size_t),
        ("user_data", ctypes.c_uint64),
    ]


class nerva_chat_message(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


class nerva_timings(ctypes.Structure):
    _fields_ = [
        ("queue_us", ctypes.c_uint64),
        ("first_token_us", ctypes.c_uint64),
        ("decode_us", ctypes.c_uint64),
        ("inter_token_us", ctypes.c_uint64),
        ("prompt_tokens", ctypes.c_uint32),
        ("generated_tokens", ctypes.c_uint32),
    ]


class nerva_event(ctypes.Structure):
    _fields_ = [
        ("tag", ctypes.c_uint64),
        ("user_data", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("sample", ctypes.c_uint32),
        ("status", ctypes.c_uint32),
        ("finish_reason", ctypes.c_uint32),
        ("position", ctypes.c_uint32),
        ("n_tokens", ctypes.c_uint32),
        ("n_logprobs", ctypes.c_uint32),
        ("tokens", ctypes.c_uint32 * EVENT_MAX_TOKENS),
        ("logprobs", ctypes.c_float * EVENT_MAX_TOKENS),
        # Not c_char_p: text is length-delimited and may contain NUL bytes.
        ("text", ctypes.POINTER(ctypes.c_char)),
        ("text_len", ctypes.c_size_t),
        ("timings", nerva_timings),
    ]


MODEL_NAME_BYTES = 256
MODEL_FIELD_BYTES = 32


class nerva_model_info(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * MODEL_NAME_BYTES),
        ("architecture", ctypes.c_char * MODEL_FIELD_BYTES),
        ("dtype", ctypes.c_char * MODEL_FIELD_BYTES),
        ("vocab_size", ctypes.c_uint32),
        ("max_context", ctypes.c_uint32),
        ("max_batch", ctypes.c_uint32),
        ("max_samples", ctypes.c_uint32),
        ("max_stop_strings", ctypes.c_uint32),
        ("max_stop_string_bytes", ctypes.c_uint32),
        ("max_stop_token_ids", ctypes.c_uint32),
        ("max_top_logprobs", ctypes.c_uint32),
        ("max_ring_entries", ctypes.c_uint32),
        ("has_tokenizer", ctypes.c_bool),
        ("max_data_bytes", ctypes.c_uint64),
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("data_bytes", ctypes.c_uint64),
        ("reply_bytes", ctypes.c_uint64),
    ]


class NervaClientHandle(ctypes.Structure):
    """Opaque ``struct nerva_client``."""


def _candidates() -> List[str]:
    env = os.environ.get("NERVA_CLIENT_LIB")
    out: List[str] = []
    if env:
        out.append(env)
    # A checkout: libnerva-client/python/nerva/_ffi.py -> <repo>/target/{debug,release}.
    here = Path(__file__).resolve()
    for parent in here.parents:
        for profile in ("debug", "release"):
            p = parent / "target" / profile / "libnerva_client.so"
            if p.exists():
                out.append(str(p))
        if (parent / "Cargo.toml").exists() and (parent / "rings").is_dir():
            break
    found = ctypes.util.find_library("nerva_client")
    if found:
        out.append(found)
    # The dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache, an installed prefix).
    out.append("libnerva_client.so")
    return out


def _declare(lib: ctypes.CDLL) -> None:
    P = ctypes.POINTER
    client_p = P(NervaClientHandle)
    sigs = {
        "nerva_client_connect": (ctypes.c_int, [ctypes.c_char_p, P(client_p)]),
        "nerva_client_close": (None, [client_p]),
        "nerva_client_submit_text": (
            ctypes.c_int,
            [client_p, ctypes.c_char_p, ctypes.c_size_t, P(nerva_generate_params), P(ctypes.c_uint64)],
        ),
        "nerva_client_submit_tokens": (
            ctypes.c_int,
            [client_p, P(ctypes.c_uint32), ctypes.c_size_t, P(nerva_generate_params), P(ctypes.c_uint64)],
        ),
        "nerva_client_submit_chat": (
            ctypes.c_int,
            [client_p, P(nerva_chat_message), ctypes.c_size_t, P(nerva_generate_params), P(ctypes.c_uint64)],
        ),
        "nerva_client_poll": (
            ctypes.c_int,
            [client_p, P(nerva_event), ctypes.c_size_t, P(ctypes.c_size_t)],
        ),
        "nerva_client_wait": (ctypes.c_int, [client_p, ctypes.c_int]),
        "nerva_client_cancel": (ctypes.c_int, [client_p, ctypes.c_uint64]),
        "nerva_client_nop": (ctypes.c_int, [client_p, P(ctypes.c_uint64)]),
        "nerva_client_fd": (ctypes.c_int, [client_p, P(ctypes.c_int)]),
        "nerva_client_model_info": (ctypes.c_int, [client_p, P(nerva_model_info)]),
        "nerva_client_tokenize": (
            ctypes.c_int,
            [client_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool, P(ctypes.c_uint32),
             ctypes.c_size_t, P(ctypes.c_size_t)],
        ),
        "nerva_client_detokenize": (
            ctypes.c_int,
            [client_p, P(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p,
             ctypes.c_size_t, P(ctypes.c_size_t)],
        ),
        "nerva_generate_default_params": (nerva_generate_params, []),
        "nerva_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "nerva_request_status_string": (ctypes.c_char_p, [ctypes.c_uint32]),
        "nerva_abi_version": (ctypes.c_uint32, []),
        "nerva_version_string": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


_lib: Optional[ctypes.CDLL] = None


def load() -> ctypes.CDLL:
    """The loaded library (first call loads it). Raises ``OSError`` naming every path tried."""
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for cand in _candidates():
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            errors.append(f"{cand}: {e}")
            continue
        _declare(lib)
        abi = lib.nerva_abi_version()
        if abi != ABI_VERSION:
            errors.append(f"{cand}: C ABI version {abi}, this package speaks {ABI_VERSION}")
            continue
        _lib = lib
        return lib
    raise OSError(
        "cannot load libnerva_client.so (build it with `cargo build -p nerva-client`, "
        "install it with libnerva-client/install.sh, or set NERVA_CLIENT_LIB); tried:\n  "
        + "\n  ".join(errors)
    )
