"""Python client for nervad, the Nerva inference daemon, over libnerva-client's C ABI.

>>> import nerva
>>> with nerva.Client() as c:                                   # doctest: +SKIP
...     print(c.generate("Once upon a time", max_tokens=16).text)
...     for ev in c.stream_chat([{"role": "user", "content": "Hi"}], max_tokens=16):
...         if isinstance(ev, nerva.TextEvent):
...             print(ev.text, end="")

``libnerva_client.so`` is found through ``$NERVA_CLIENT_LIB``, a ``target/`` directory of the
checkout this package lives in, or the dynamic loader's search path (an installed prefix).
"""

from ._ffi import load as _load
from .aio import AsyncClient
from .client import (
    Client,
    DaemonGoneError,
    DoneEvent,
    Event,
    GenerateParams,
    Generation,
    InvalidArgumentError,
    Message,
    ModelInfo,
    NervaError,
    NoDaemonError,
    Prompt,
    QueueFullError,
    RequestError,
    Sample,
    ShutdownEvent,
    ShuttingDownError,
    TextEvent,
    Timings,
    TokensEvent,
    TopLogprobsEvent,
)

__version__ = "0.1.0"


def library_version() -> str:
    """The loaded libnerva-client's version string (``nerva_version_string``)."""
    return _load().nerva_version_string().decode()


__all__ = [
    "AsyncClient",
    "Client",
    "DaemonGoneError",
    "DoneEvent",
    "Event",
    "GenerateParams",
    "Generation",
    "InvalidArgumentError",
    "Message",
    "ModelInfo",
    "NervaError",
    "NoDaemonError",
    "Prompt",
    "QueueFullError",
    "RequestError",
    "Sample",
    "ShutdownEvent",
    "ShuttingDownError",
    "TextEvent",
    "Timings",
    "TokensEvent",
    "TopLogprobsEvent",
    "library_version",
]
