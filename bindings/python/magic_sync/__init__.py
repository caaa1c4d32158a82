"""magic_sync for Python: a replica that keeps a SQLite file in sync with a
magic_sync server, for an app with no Rust of its own.

It wraps the C ABI (``libmagic_sync_ffi``, header ``magic_sync.h``) with
ctypes: the replica follows the server's description of its tables, its
loop runs on a thread of its own, and the app reads and writes the file
with the standard library's ``sqlite3``::

    import magic_sync, sqlite3

    with magic_sync.Replica("till.sqlite", "till-7") as replica:
        replica.run("wss://sync.example.com", secret, server_key)
        ...
        db = sqlite3.connect("till.sqlite")
        with db:
            db.execute("INSERT INTO sales (id, till, total) VALUES (?, ?, ?)", ...)
        mark = replica.mark()
        replica.wait_written(mark, magic_sync.Written.FILED, timeout=30)

The library is looked for where ``MAGIC_SYNC_LIB`` says (a file), then
beside this package, then where the system's loader looks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

__all__ = [
    "Bug",
    "Error",
    "InvalidArgument",
    "InvalidHandle",
    "Replica",
    "RetryLater",
    "Running",
    "SetAside",
    "Stopped",
    "Written",
    "shares_sqlite",
]


class Written(enum.IntEnum):
    """How far the app's writes up to a mark went."""

    #: Some are on this replica only: not sent yet, or not filed yet.
    HERE = 0
    #: The server filed them all; what it did because of them has not all
    #: come back yet.
    FILED = 1
    #: Filed, and everything the server did because of them applied here:
    #: the app reads its own writes.
    REACHED = 2


class Error(Exception):
    """A call that failed: ``code`` is the library's ``ms_code``, and the
    message its words."""

    code = -1

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


class RetryLater(Error):
    """It failed on what may pass (the app held the file past the busy
    timeout): the same call again, later, may go through."""

    code = 1


class SetAside(Error):
    """What it was about was left, and the rest goes on."""

    code = 2


class Stopped(Error):
    """Only the app's operator can end it: a key not trusted, a file that
    cannot be written, a description the replica cannot follow."""

    code = 3


class InvalidHandle(Error):
    """The replica was closed."""

    code = 4


class InvalidArgument(Error):
    """An argument is not what it should be: a server key that is no key,
    an address that is no ``ws://`` or ``wss://``."""

    code = 5


class Running(Error):
    """The replica's loop runs already: stop it first."""

    code = 6


class Bug(Error):
    """A bug in the library, caught at its boundary."""

    code = 7


_ERRORS = {e.code: e for e in (RetryLater, SetAside, Stopped, InvalidHandle, InvalidArgument, Running, Bug)}

_ON_APPLIED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)


def _load() -> ctypes.CDLL:
    names = []
    if os.environ.get("MAGIC_SYNC_LIB"):
        names.append(os.environ["MAGIC_SYNC_LIB"])
    here = Path(__file__).resolve().parent
    for file in ("libmagic_sync_ffi.so", "libmagic_sync_ffi.dylib", "magic_sync_ffi.dll"):
        if (here / file).exists():
            names.append(str(here / file))
    found = ctypes.util.find_library("magic_sync_ffi")
    if found:
        names.append(found)
    tried = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ImportError(
        "magic_sync: the library libmagic_sync_ffi was not found "
        "(build it with `cargo build --release -p magic_sync_ffi`, and set "
        "MAGIC_SYNC_LIB to the file)" + ("; tried " + "; ".join(tried) if tried else "")
    )


_lib = _load()

_handle = ctypes.c_void_p
_out_string = ctypes.POINTER(ctypes.c_void_p)
for _name, _args in {
    "ms_replica_open": [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_handle)],
    "ms_replica_run": [_handle, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p],
    "ms_replica_stop": [_handle],
    "ms_replica_trust": [_handle, ctypes.c_char_p],
    "ms_replica_nudge": [_handle],
    "ms_replica_trust_certificates": [_handle, ctypes.c_char_p],
    "ms_replica_close": [_handle],
    "ms_replica_on_applied": [_handle, _ON_APPLIED, ctypes.c_void_p],
    "ms_replica_status": [_handle, _out_string],
    "ms_replica_progress": [_handle, _out_string],
    "ms_replica_mark": [_handle, ctypes.POINTER(ctypes.c_int64)],
    "ms_replica_written": [_handle, ctypes.c_int64, ctypes.POINTER(ctypes.c_int)],
    "ms_replica_wait_written": [
        _handle,
        ctypes.c_int64,
        ctypes.c_uint32,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int),
    ],
}.items():
    _function = getattr(_lib, _name)
    _function.argtypes = _args
    _function.restype = ctypes.c_int
_lib.ms_last_error.argtypes = []
_lib.ms_last_error.restype = ctypes.c_char_p
_lib.ms_string_free.argtypes = [ctypes.c_void_p]
_lib.ms_string_free.restype = None


def shares_sqlite() -> bool:
    """Whether the library and the standard library's ``sqlite3`` use one
    SQLite in this process, so that the app may write the file while the
    replica's loop runs.

    SQLite coordinates connections in one process through the library's own
    account of the file's locks: two copies of SQLite in one process do not
    see each other's, and can corrupt the file. The library links the
    system's SQLite, as Debian's and most Linux distributions' Python does;
    a Python that carries a SQLite of its own (python.org's builds for
    macOS and Windows) does not share it, and there the app takes turns
    (closes the replica before it opens the file) or runs the replica as a
    process of its own (``magic-sync-replica``)."""
    try:
        import _sqlite3  # the module sqlite3 is made of

        ours = getattr(_lib, "sqlite3_libversion")
        theirs = getattr(ctypes.CDLL(_sqlite3.__file__), "sqlite3_libversion")
    except (AttributeError, ImportError, OSError):
        # A library or a Python that keeps its SQLite to itself.
        return False
    return ctypes.cast(ours, ctypes.c_void_p).value == ctypes.cast(theirs, ctypes.c_void_p).value


def _check(code: int) -> None:
    """Raises the error for ``code``, with the words the library kept for
    this thread."""
    if code == 0:
        return
    words = _lib.ms_last_error()
    text = words.decode("utf-8", "replace") if words else f"code {code}"
    raise _ERRORS.get(code, Error)(text)


def _json(function: Any, handle: ctypes.c_void_p) -> Any:
    out = ctypes.c_void_p()
    _check(function(handle, ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode("utf-8"))
    finally:
        _lib.ms_string_free(out)


class Replica:
    """A replica in the SQLite file at ``path``, as ``replica_id``: opened
    (or created) at once, following the server's description of its
    tables. Close it, or use it in a ``with`` block."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], replica_id: str) -> None:
        self._handle = _handle()
        self._on_applied: Optional[Any] = None
        _check(
            _lib.ms_replica_open(
                os.fspath(path).encode("utf-8"), replica_id.encode("utf-8"), ctypes.byref(self._handle)
            )
        )

    def __enter__(self) -> "Replica":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def run(self, server: str, secret: str, server_key: str) -> None:
        """Starts the loop on a thread of its own, connected to ``server``
        (``wss://host:port``, or ``ws://`` to this machine) with the secret
        its host issued it, applying only what ``server_key`` signed.
        Returns at once: the loop connects, and connects again, on its own;
        ``status()["link_error"]`` says why it cannot."""
        _check(
            _lib.ms_replica_run(
                self._handle, server.encode("utf-8"), secret.encode("utf-8"), server_key.encode("utf-8")
            )
        )

    def trust(self, server_key: str) -> None:
        """Pins the server's key as it was handed over with the secret;
        ``run`` pins the key it is given too. A replica that pinned another
        key refuses this one (``Stopped``)."""
        _check(_lib.ms_replica_trust(self._handle, server_key.encode("utf-8")))

    def nudge(self) -> None:
        """Tells the running loop the app wrote something: it sends it up now
        rather than at its next look (a tenth of a second at most)."""
        _check(_lib.ms_replica_nudge(self._handle))

    def trust_certificates(self, pem_path: Optional[Union[str, "os.PathLike[str]"]]) -> None:
        """Has the next ``run`` trust the PEM certificates in the file at
        ``pem_path`` in place of the system's roots; ``None`` goes back to
        the system's roots."""
        path = os.fspath(pem_path).encode("utf-8") if pem_path is not None else None
        _check(_lib.ms_replica_trust_certificates(self._handle, path))

    def stop(self) -> None:
        """Ends the loop after the message it applies, and waits for it."""
        _check(_lib.ms_replica_stop(self._handle))

    def close(self) -> None:
        """Stops the loop if it runs, and closes the replica. Closing twice
        is nothing."""
        if self._handle.value is None:
            return
        try:
            _check(_lib.ms_replica_close(self._handle))
        finally:
            self._handle = _handle()
            self._on_applied = None

    def on_applied(self, callback: Optional[Callable[[int], None]]) -> None:
        """Has ``callback`` called with the number of each message applied,
        on the replica's thread: it must not block (set an event, post to a
        queue). ``None`` calls nothing."""
        wrapped = _ON_APPLIED(lambda _context, message: callback(message)) if callback else _ON_APPLIED()
        _check(_lib.ms_replica_on_applied(self._handle, wrapped, None))
        # Kept while the library may call it.
        self._on_applied = wrapped

    def status(self) -> dict:
        """Where the replica stands: ``ready``, ``applied``, ``gap``,
        ``unfiled``, ``running``, ``connected``, ``link_error`` and the rest
        (as ``magic-sync-replica --status --json`` prints)."""
        return _json(_lib.ms_replica_status, self._handle)

    def progress(self) -> dict:
        """Per table the app writes, rows not sent up yet and rows sent and
        not filed yet: ``{"tables": [{"table", "unsent", "unfiled"}]}``."""
        return _json(_lib.ms_replica_progress, self._handle)

    def mark(self) -> int:
        """The mark of everything the app wrote to the file so far."""
        out = ctypes.c_int64()
        _check(_lib.ms_replica_mark(self._handle, ctypes.byref(out)))
        return out.value

    def written(self, mark: int) -> Written:
        """How far the app's writes up to ``mark`` went."""
        out = ctypes.c_int()
        _check(_lib.ms_replica_written(self._handle, mark, ctypes.byref(out)))
        return Written(out.value)

    def wait_written(self, mark: int, until: Written = Written.FILED, timeout: float = 30.0) -> Written:
        """Waits up to ``timeout`` seconds until the app's writes up to
        ``mark`` went as far as ``until``; says how far they went (less than
        ``until`` when the time ran out)."""
        out = ctypes.c_int()
        _check(
            _lib.ms_replica_wait_written(
                self._handle, mark, int(until), max(0, int(timeout * 1000)), ctypes.byref(out)
            )
        )
        return Written(out.value)

    def wait_ready(self, timeout: float = 60.0) -> dict:
        """Waits up to ``timeout`` seconds until the replica holds a whole
        snapshot, waking at each message applied; returns its status.
        Raises ``TimeoutError`` with the status when it is not ready. It
        replaces the ``on_applied`` callback while it waits."""
        applied = threading.Event()
        self.on_applied(lambda _message: applied.set())
        try:
            deadline = time.monotonic() + timeout
            while True:
                applied.clear()
                status = self.status()
                if status["ready"]:
                    return status
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"not ready in {timeout} s: {status}")
                # Woken by the next message, or at least once a second to
                # look again (a snapshot may end with nothing to apply).
                applied.wait(min(left, 1.0))
        finally:
            self.on_applied(None)
