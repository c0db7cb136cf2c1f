"""Errors raised while decoding KV-event messages."""

from __future__ import annotations


class EventDecodeError(ValueError):
    """A KV-event message (ZMQ frames + msgpack payload) is malformed; says what and where.

    The wire format is vLLM's (docs/specs/hashing.md §1.7), which SGLang shares (§5).

    Attributes:
        reason: what is wrong, without the location prefix.
        event: 0-based index of the offending event in the batch's ``events`` list
            (``None`` when the problem is in the frames or the batch envelope).
        message: 0-based index of the message in a stream (set by
            :func:`~kvlab.events.decode_stream`; ``None`` for a single message).

    Example:
        >>> err = EventDecodeError("missing required field 'medium'", event=1)
        >>> str(err)
        "event 1: missing required field 'medium'"
        >>> str(err.at_message(4))
        "message 4: event 1: missing required field 'medium'"
        >>> isinstance(err, ValueError)
        True
    """

    def __init__(self, reason: str, *, event: int | None = None, message: int | None = None) -> None:
        self.reason = reason
        self.event = event
        self.message = message
        where = [f"message {message}"] if message is not None else []
        where += [f"event {event}"] if event is not None else []
        super().__init__(": ".join([*where, reason]))

    def at_message(self, message: int) -> EventDecodeError:
        """The same error located at message ``message`` of a stream (a new object)."""
        return EventDecodeError(self.reason, event=self.event, message=message)
