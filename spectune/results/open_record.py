"""Records of JSON objects that keep what they do not know, so that reading a file and writing it back loses nothing.

- :class:`OpenRecord`: the keys the record's fields name are its attributes; the others are kept in ``extra``
  (sweep.json's :class:`spectune.results.sweep_meta.SweepMeta`).
- :class:`OrderedRecord`: also the order the object had its keys in (``order``), to write them back in it
  (:class:`spectune.results.schedule_server.RecordedScheduleServer`,
  :class:`spectune.results.validate_run.RunWindow`).
- :class:`LenientRecord`: also the fields an older object lacked (``absent``), left out again when written back
  while they keep the value filled in (:class:`spectune.results.point.SweepPoint`,
  :class:`spectune.results.validate_run.ValidateRun`).

The bookkeeping fields are keyword-only and declared here, so a record's own fields (and its positional arguments)
are the object's keys, in their order.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import TypeVar

from spectune.core.json_types import JsonObject, JsonValue

__all__ = ["OpenRecord", "OrderedRecord", "LenientRecord"]

_O = TypeVar("_O", bound="OrderedRecord")

_NOT_A_KEY = {"file_key": False}
"""The metadata of a bookkeeping field: no key of the object."""


@dataclass
class OpenRecord:
    """A JSON object as a record: the keys its fields name are its attributes, ``extra`` keeps the others.

    Attributes:
        extra: keys this version does not know, carried through.
    """

    extra: JsonObject = field(default_factory=dict, kw_only=True, metadata=_NOT_A_KEY)

    @classmethod
    def file_keys(cls) -> list[str]:
        """The names of the fields that are keys of the object (all but the bookkeeping ones), in field order."""
        return [f.name for f in fields(cls) if f.metadata.get("file_key", True)]  # type: ignore[arg-type]

    @classmethod
    def split(cls, obj: JsonObject) -> tuple[JsonObject, JsonObject]:
        """(the keys of ``obj`` the record's fields name, the others), each in ``obj``'s order."""
        names = set(cls.file_keys())
        return {k: v for k, v in obj.items() if k in names}, {k: v for k, v in obj.items() if k not in names}


@dataclass
class OrderedRecord(OpenRecord):
    """An :class:`OpenRecord` that also keeps the order its object had its keys in.

    Attributes:
        order: the keys of the object it was read from, in their order (set by :meth:`read`); None for a record
            built here, whose keys are its fields, then ``extra``.
    """

    order: list[str] | None = field(default=None, init=False, repr=False, compare=False, metadata=_NOT_A_KEY)

    @classmethod
    def read(cls: type[_O], obj: JsonObject) -> _O:
        """The record of a parsed object (a key it lacks takes the field's default)."""
        known, extra = cls.split(obj)
        record = cls(**known, extra=extra)
        record.order = list(obj)
        return record

    @classmethod
    def from_json(cls: type[_O], obj: JsonValue) -> _O | None:
        """The record of a parsed object (None for None or anything but an object)."""
        return cls.read(obj) if isinstance(obj, dict) else None

    def to_json(self) -> JsonObject:
        """The object as read: its keys in their order (a record built here: the known keys, then ``extra``)."""
        known = self.file_keys()
        keys = self.order if self.order is not None else [*known, *self.extra]
        return {k: getattr(self, k) if k in known else self.extra[k] for k in keys}


@dataclass
class LenientRecord(OpenRecord):
    """An :class:`OpenRecord` read from files of older formats too: a key the object lacks takes the field's
    default, and is left out again when written back while it keeps that value.

    Attributes:
        absent: fields the object it was read from lacked -> the value filled in (set by :meth:`note_absent`).
    """

    absent: dict[str, object] = field(default_factory=dict, kw_only=True, repr=False, compare=False,
                                      metadata=_NOT_A_KEY)

    def note_absent(self, obj: JsonObject) -> None:
        """Remember the fields ``obj`` (the object this record was read from) lacks, with the values filled in."""
        self.absent = {name: copy.deepcopy(getattr(self, name)) for name in set(self.file_keys()) - set(obj)}

    def without_absent(self, obj: JsonObject) -> JsonObject:
        """``obj`` (this record written as an object) less the keys the file lacked whose fields kept the value
        filled in."""
        if not self.absent:
            return obj
        return {k: v for k, v in obj.items() if k not in self.absent or getattr(self, k) != self.absent[k]}
