"""KV-event files: a stream of ZMQ event messages in arrival order, and a JSON way to write one.

An event file (suffix ``.kvev`` by convention) holds the multipart ZMQ messages a
subscriber received, in the order it received them, each exactly as it arrived: for
vLLM's ``ZmqEventPublisher`` (docs/specs/hashing.md §1.7) that is ``[topic, seq,
payload]`` as :func:`~kvlab.events.encode_frames` writes them. Format version 1, all
integers unsigned 32-bit big-endian (as the seq frame is big-endian)::

    file     = magic message*                  (no trailer: the file ends after the last message)
    magic    = "KVLABEV1"                      (8 ASCII bytes; the last one is the format version)
    message  = num_frames frame{num_frames}        (1 <= num_frames <= MAX_FRAMES_PER_MESSAGE)
    frame    = length bytes{length}            (0 <= length < 2**32)

An empty stream is the 8 magic bytes alone. Nothing else is stored: a batch's publish
time is inside its payload (``EventBatch.ts``), and arrival order is file order. A reader
checks the structure (magic, frame counts, lengths within the file) and nothing about the
frames' contents; :func:`decode_event_file` decodes them as :func:`~kvlab.events.decode_stream`
does, a malformed message becoming an error entry while the others are kept.

Example (the three frames of one message, ``[b"kv@pod-a@m", seq 0, payload]``):

    >>> import tempfile, pathlib
    >>> from kvlab.events import AllBlocksCleared, EventBatch
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "one.kvev"
    >>> write_event_file(path, [("kv@pod-a@m", 0, EventBatch(1.0, [AllBlocksCleared()], 0))])
    1
    >>> raw = path.read_bytes()
    >>> raw[:8], raw[8:12].hex(), raw[12:16].hex(), raw[16:26]
    (b'KVLABEV1', '00000003', '0000000a', b'kv@pod-a@m')
    >>> [d.topic for d in decode_event_file(path)]
    ['kv@pod-a@m']

The JSON description (:func:`load_event_description`) is a hand-writable list of messages
for ``kvlab events write``; see :func:`parse_event_description`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import BinaryIO

from kvlab.core.validate import check_u64
from kvlab.events.errors import EventDecodeError
from kvlab.events.types import EVENT_TYPES, EventBatch
from kvlab.events.wire import DecodedBatch, _as_bytes, decode_stream, encode_frames

#: The first 8 bytes of a version-1 event file.
MAGIC = b"KVLABEV1"
#: Frames one message may have in a file (vLLM sends 3); a larger count means a corrupt file.
MAX_FRAMES_PER_MESSAGE = 64
_U32_LIMIT = 1 << 32

#: A message to write: its frames, or ``(topic, seq, batch)`` to encode with :func:`~kvlab.events.encode_frames`.
EventMessage = Sequence[bytes] | tuple[str, int, EventBatch]


def _message_frames(index: int, message: object, layout: str) -> list[bytes]:
    if isinstance(message, tuple) and len(message) == 3 and isinstance(message[2], EventBatch):
        topic, seq, batch = message
        try:
            return encode_frames(batch, topic=topic, seq=seq, layout=layout)
        except ValueError as err:
            raise ValueError(f"messages[{index}]: {err}") from None
    if isinstance(message, (bytes, bytearray, memoryview, str)) or not isinstance(message, Sequence):
        raise ValueError(f"messages[{index}] must be a list of frames or a (topic, seq, EventBatch) tuple, "
                         f"got {type(message).__name__}")
    if not 1 <= len(message) <= MAX_FRAMES_PER_MESSAGE:
        raise ValueError(f"messages[{index}] has {len(message)} frames; a message has 1 to "
                         f"{MAX_FRAMES_PER_MESSAGE}")
    frames = []
    for position, frame in enumerate(message):
        raw = _as_bytes(frame)
        if raw is None:
            raise ValueError(f"messages[{index}] frame {position} must be bytes, bytearray, memoryview or a "
                             f"zmq.Frame, got {type(frame).__name__}")
        if len(raw) >= _U32_LIMIT:
            raise ValueError(f"messages[{index}] frame {position} has {len(raw)} bytes; a frame holds < 2**32")
        frames.append(raw)
    return frames


def write_event_file(path: str | os.PathLike, messages: Iterable[EventMessage], *, layout: str = "map") -> int:
    """Write ``messages``, in order, as an event file (format in the module docstring).

    The file is written to a temporary name beside ``path`` and renamed when complete, so
    a bad message leaves no partial file (and an existing ``path`` untouched). The file
    gets the mode of any new file (``0o666`` less the umask, e.g. ``0o644``).

    Args:
        path: the file to (over)write.
        messages: each a list of frames (bytes-like or ``zmq.Frame``), or a
            ``(topic, seq, EventBatch)`` tuple encoded by :func:`~kvlab.events.encode_frames`.
        layout: the event layout of encoded tuples, ``"map"`` (vLLM 0.33) or ``"array"``.

    Returns:
        The number of messages written.

    Raises:
        ValueError: naming the message index: not a frame list or a tuple, no frames or
            more than :data:`MAX_FRAMES_PER_MESSAGE`, a frame that is not bytes-like or
            is 4 GiB or larger, a tuple :func:`~kvlab.events.encode_frames` refuses (bad
            topic, seq or layout). ``messages`` not iterable. ``path`` is a folder.
        OSError: the folder does not exist or is not writable.
    """
    if isinstance(messages, (bytes, bytearray, memoryview, str)) or not isinstance(messages, Iterable):
        raise ValueError(f"messages must be an iterable of messages, got {type(messages).__name__}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"cannot write {path}: it is a folder (give a file path, e.g. {path / 'stream.kvev'})")
    handle, temporary = _create_temporary(path)
    try:
        with handle:
            handle.write(MAGIC)
            count = 0
            for count, message in enumerate(messages, start=1):
                frames = _message_frames(count - 1, message, layout)
                handle.write(len(frames).to_bytes(4, "big"))
                for frame in frames:
                    handle.write(len(frame).to_bytes(4, "big"))
                    handle.write(frame)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return count


def _create_temporary(path: Path) -> tuple[BinaryIO, Path]:
    """A new hidden file beside ``path`` (random name, created exclusively), open for
    writing, with the mode of any new file: ``0o666`` less the umask (the usual
    :func:`tempfile.mkstemp` would make it ``0o600``)."""
    temporary = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return os.fdopen(descriptor, "wb"), temporary


class _Reader:
    """Reads one event file; every error names the file, the message index and the byte offset."""

    def __init__(self, path: Path, handle: BinaryIO) -> None:
        self.path, self.handle = path, handle
        self.size_bytes = os.fstat(handle.fileno()).st_size
        self.offset = 0

    def fail(self, index: int | None, reason: str) -> ValueError:
        where = f"message {index} at byte {self.offset}" if index is not None else f"byte {self.offset}"
        return ValueError(f"{self.path}: {where}: {reason}")

    def read(self, num_bytes: int, index: int | None, what: str) -> bytes:
        left = self.size_bytes - self.offset
        if num_bytes > left:
            raise self.fail(index, f"{what} needs {num_bytes} bytes but only {left} remain: the file is truncated "
                                   f"or corrupt")
        data = self.handle.read(num_bytes)
        if len(data) != num_bytes:  # the file shrank while being read
            raise self.fail(index, f"{what}: expected {num_bytes} bytes, read {len(data)}")
        self.offset += num_bytes
        return data

    def check_magic(self) -> None:
        magic = self.handle.read(len(MAGIC))
        if magic != MAGIC:
            hint = (f"a kvlab event file of another version ({magic[-1:].decode('ascii', 'replace')!r})"
                    if len(magic) == len(MAGIC) and magic[:-1] == MAGIC[:-1] else "not a kvlab event file")
            raise ValueError(f"{self.path}: byte 0: expected the magic {MAGIC!r}, got {magic!r}: {hint}")
        self.offset = len(MAGIC)

    def messages(self) -> Iterator[list[bytes]]:
        index = 0
        while self.offset < self.size_bytes:
            start = self.offset
            num_frames = int.from_bytes(self.read(4, index, "the frame count"), "big")
            if not 1 <= num_frames <= MAX_FRAMES_PER_MESSAGE:
                self.offset = start
                raise self.fail(index, f"frame count {num_frames} is not in [1, {MAX_FRAMES_PER_MESSAGE}]: the file "
                                       f"is corrupt")
            frames = []
            for position in range(num_frames):
                length = int.from_bytes(self.read(4, index, f"frame {position}'s length"), "big")
                frames.append(self.read(length, index, f"frame {position} ({length} bytes)"))
            yield frames
            index += 1


def read_event_file(path: str | os.PathLike) -> Iterator[list[bytes]]:
    """The messages of an event file, in arrival order, each a list of frames (``bytes``).

    The file is opened and its magic checked at the call; the messages are read lazily,
    so a structural error later in the file is raised when the iteration reaches it,
    after the messages before it were yielded (``list(read_event_file(p))`` reads all
    or raises).

    Returns:
        An iterator of ``list[bytes]``; the file is closed when it is exhausted.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file, the message index and the byte offset: a wrong
            magic (another format, or another version), a frame count of 0 or above
            :data:`MAX_FRAMES_PER_MESSAGE`, a count or frame length running past the end
            of the file (truncated or corrupt).
    """
    path = Path(path)
    handle = path.open("rb")
    reader = _Reader(path, handle)
    try:
        reader.check_magic()
    except BaseException:
        handle.close()
        raise

    def messages() -> Iterator[list[bytes]]:
        with handle:
            yield from reader.messages()

    return messages()


def decode_event_file(path: str | os.PathLike) -> list[DecodedBatch | EventDecodeError]:
    """Read and decode every message of an event file, in order.

    Returns:
        One entry per message, as :func:`~kvlab.events.decode_stream` gives them: the
        :class:`~kvlab.events.DecodedBatch`, or the :class:`~kvlab.events.EventDecodeError`
        of a malformed message (its ``message`` attribute the 0-based index); a bad
        message does not stop the others.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_event_file` (the file's structure);
            no entry is returned then.
    """
    return decode_stream(list(read_event_file(path)))


_MESSAGE_KEYS = ("pod", "model", "seq", "ts", "data_parallel_rank", "events")
_BY_TAG = {cls.__name__: cls for cls in EVENT_TYPES}
#: Fields a JSON event must give; every other field defaults to None (vLLM's null).
_JSON_REQUIRED = {"BlockStored": ("block_hashes", "token_ids", "block_size"), "BlockRemoved": ("block_hashes",),
                  "AllBlocksCleared": ()}


def _from_json(path: str, value: object) -> object:
    """JSON → event field value: ``{"bytes_hex": "..."}`` → bytes, recursively in lists."""
    if isinstance(value, list):
        return [_from_json(f"{path}[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, dict) and set(value) == {"bytes_hex"}:
        try:
            return bytes.fromhex(value["bytes_hex"])
        except (TypeError, ValueError):
            raise ValueError(f"{path}.bytes_hex must be a string of hex digit pairs, "
                             f"got {value['bytes_hex']!r}") from None
    return value


def _located(path: str, names: Iterable[str], err: ValueError) -> ValueError:
    """A constructor's error located at ``path``: ``path.field ...`` when it starts with a field name."""
    text = str(err)
    head = text.split(" ", 1)[0].split("[", 1)[0].rstrip(":")
    return ValueError(f"{path}.{text}" if head in names else f"{path}: {text}")


def _parse_event(path: str, raw: object) -> object:
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must be an object with a 'type', got {type(raw).__name__} {raw!r}")
    tag = raw.get("type")
    if tag not in _BY_TAG:
        raise ValueError(f"{path}.type must be one of {', '.join(_BY_TAG)}, got {tag!r}")
    cls = _BY_TAG[tag]
    names = [f.name for f in fields(cls)]
    unknown = [key for key in raw if key != "type" and key not in names]
    if unknown:
        raise ValueError(f"{path}: {tag} has no field {unknown[0]!r} (fields: {', '.join(names) or 'none'})")
    missing = [name for name in _JSON_REQUIRED[tag] if name not in raw]
    if missing:
        hint = ' (use "token_ids": [] for a tier update)' if "token_ids" in missing else ""
        raise ValueError(f"{path}: {tag} needs {', '.join(map(repr, missing))}{hint}")
    if raw.get("medium") == "":  # the event classes take it (vLLM's decoder does); tier_of_medium refuses it
        raise ValueError(f'{path}.medium must be null or a non-empty string (a tier such as "GPU"), got \'\'')
    values = {name: _from_json(f"{path}.{name}", raw.get(name)) for name in names}
    try:
        return cls(**values)
    except ValueError as err:
        raise _located(path, names, err) from None


def _topic_part(path: str, value: object, what: str, allow_at: bool) -> str:
    if not isinstance(value, str) or not value or ("@" in value and not allow_at):
        rule = "" if allow_at else " without '@'"
        raise ValueError(f"{path} must be a non-empty string{rule} ({what} of the topic kv@<pod>@<model>), "
                         f"got {value!r}")
    return value


def parse_event_description(description: object) -> list[tuple[str, int, EventBatch]]:
    """Messages from a JSON description, ready for :func:`write_event_file`.

    The description is a list of messages (or ``{"messages": [...]}``); each message::

        {"pod": "pod-a", "model": "m",          # topic "kv@pod-a@m" (llm-d's form, index_blend.md L19)
         "seq": 0,                              # optional: default the pod's previous seq + 1, from 0
         "ts": 1.0,                             # optional publish time, s (default 0.0)
         "data_parallel_rank": 0,               # optional (default 0, as vLLM's publisher)
         "events": [{"type": "BlockStored", "block_hashes": [1, 2], "token_ids": [...],
                     "block_size": 16, "medium": "GPU"},
                    {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
                    {"type": "AllBlocksCleared"}]}

    Event fields are the dataclasses' (:class:`~kvlab.events.BlockStored` ...); a
    BlockStored needs ``block_hashes``, ``token_ids`` and ``block_size`` (a tier update,
    llm-d rule L17, gives ``"token_ids": []``), a BlockRemoved ``block_hashes``; every
    other field defaults to null. A ``medium`` is null or a non-empty string: the event
    classes take ``""`` as vLLM's decoder does, but no index tier has that name. A digest-bytes hash (or any
    bytes value) is written ``{"bytes_hex": "..."}``. Sequence numbers are per pod, as
    llm-d tracks them: an explicit ``seq`` (e.g. to leave a gap) restarts the pod's count.

    Returns:
        ``[(topic, seq, EventBatch), ...]`` in description order.

    Raises:
        ValueError: naming the JSON path and value, e.g.
            ``messages[3].events[1].block_size must be an integer >= 1, got 0``: not a
            list, an unknown or missing key, an empty pod or model, a pod holding ``@``
            (llm-d splits the topic at the first two), a seq outside ``[0, 2**64)``, an unknown event type,
            an empty ``medium``, any value the event classes refuse.

    Example:
        >>> parse_event_description([{"pod": "p", "model": "m", "events": [{"type": "AllBlocksCleared"}]},
        ...                          {"pod": "p", "model": "m", "ts": 2, "events": []}])
        [('kv@p@m', 0, EventBatch(ts=0.0, events=(AllBlocksCleared(),), data_parallel_rank=0)), \
('kv@p@m', 1, EventBatch(ts=2.0, events=(), data_parallel_rank=0))]
    """
    if isinstance(description, dict):
        if set(description) != {"messages"}:
            raise ValueError(f"a description object has exactly one key, 'messages', got {sorted(description)}")
        description = description["messages"]
    if not isinstance(description, list):
        raise ValueError(f"messages must be a list, got {type(description).__name__}")
    next_seq: dict[str, int] = {}
    result = []
    for index, raw in enumerate(description):
        path = f"messages[{index}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{path} must be an object, got {type(raw).__name__} {raw!r}")
        unknown = [key for key in raw if key not in _MESSAGE_KEYS]
        if unknown:
            raise ValueError(f"{path}: unknown key {unknown[0]!r} (keys: {', '.join(_MESSAGE_KEYS)})")
        for key in ("pod", "model", "events"):
            if key not in raw:
                raise ValueError(f"{path}: missing {key!r}")
        pod = _topic_part(f"{path}.pod", raw["pod"], "the pod-id segment", allow_at=False)
        model = _topic_part(f"{path}.model", raw["model"], "the model segment", allow_at=True)
        seq = raw.get("seq", next_seq.get(pod, 0))
        seq = check_u64(f"{path}.seq", seq)
        next_seq[pod] = seq + 1
        events = raw["events"]
        if not isinstance(events, list):
            raise ValueError(f"{path}.events must be a list, got {type(events).__name__} {events!r}")
        parsed = [_parse_event(f"{path}.events[{i}]", event) for i, event in enumerate(events)]
        try:
            batch = EventBatch(raw.get("ts", 0.0), parsed, raw.get("data_parallel_rank", 0))
        except ValueError as err:
            raise _located(path, ("ts", "data_parallel_rank"), err) from None
        result.append((f"kv@{pod}@{model}", seq, batch))
    return result


def load_event_description(path: str | os.PathLike) -> list[tuple[str, int, EventBatch]]:
    """:func:`parse_event_description` of a JSON file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``<path>: `` then what is wrong: not UTF-8, not JSON (with line and
            column), or a :func:`parse_event_description` error (with the JSON path).
    """
    path = Path(path)
    try:
        description = json.loads(path.read_bytes().decode("utf-8-sig"))  # a leading BOM skipped
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    try:
        return parse_event_description(description)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
