"""The compact records format: `RequestRecord`s as Parquet (Apache Arrow columns, zstd).

JSON lines (requests.jsonl) stay the default, for small runs and for people; requests.parquet is
for big ones, and pandas, polars and DuckDB read it as it is. The Arrow schema is derived from
`RequestRecord`'s fields, so the record's field list stays in one place (core/records.py).
pyarrow is an optional extra (`pip install 'loadgen[parquet]'`) imported only here, when a
Parquet file is written or read.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .records import RequestRecord, Usage

PARQUET_FILE = "requests.parquet"
COMPRESSION = "zstd"


def _arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 (the submodule is what writes and reads files)
    except ImportError:
        raise ConfigError("the Parquet records format needs pyarrow: pip install 'loadgen[parquet]'") from None
    return pyarrow


def _arrow_type(pa: Any, annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if list in (typing.get_origin(a) for a in args):
        return pa.list_(pa.int64())
    if Usage in args:
        return pa.struct([(name, pa.int64()) for name in Usage.__struct_fields__])
    if bool in args:  # output_valid
        return pa.bool_()
    if float in args:  # float, or a level: int | float (closed-loop levels come back as whole numbers)
        return pa.float64()
    if int in args:
        return pa.int64()
    return pa.string()


def schema() -> Any:
    pa = _arrow()
    hints = typing.get_type_hints(RequestRecord)
    fields = []
    for name in RequestRecord.__struct_fields__:
        kind = _arrow_type(pa, hints[name])
        if kind == pa.string() and name in ("target", "error_kind", "stop_type", "finish_reason"):
            kind = pa.dictionary(pa.int32(), pa.string())  # few distinct values
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


def to_table(records: list[RequestRecord], arrow_schema: Any) -> Any:
    pa = _arrow()
    columns = {name: [getattr(r, name) for r in records] for name in RequestRecord.__struct_fields__}
    columns["usage"] = [None if u is None else {k: getattr(u, k) for k in Usage.__struct_fields__}
                        for u in columns["usage"]]
    return pa.Table.from_pydict(columns, schema=arrow_schema)


class ParquetWriter:
    """Appends batches of records as row groups; the file is readable once `close` wrote its footer."""

    def __init__(self, path: Path) -> None:
        pa = _arrow()
        self.schema = schema()
        self._writer = pa.parquet.ParquetWriter(path if hasattr(path, "write") else str(path), self.schema, compression=COMPRESSION,
                                                use_dictionary=True)

    def write(self, records: list[RequestRecord]) -> None:
        self.write_table(to_table(records, self.schema))

    def write_table(self, table: Any) -> None:
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()


class ParquetColumns:
    """A records file written row group by row group: batches are held as Arrow tables until
    `row_group` records are gathered, then written (close() writes the rest and the footer)."""

    def __init__(self, path: Path, row_group: int) -> None:
        self._writer = ParquetWriter(path)
        self._row_group = row_group
        self._tables: list[Any] = []
        self._rows = 0

    def table(self, records: list[RequestRecord]) -> Any:
        """A batch as Arrow columns (for `add`)."""
        return to_table(records, self._writer.schema)

    def add(self, table: Any) -> None:
        self._tables.append(table)
        self._rows += table.num_rows
        if self._rows >= self._row_group:
            self._flush()

    def _flush(self) -> None:
        if self._tables:
            pa = _arrow()
            self._writer.write_table(pa.concat_tables(self._tables))
        self._tables, self._rows = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a Parquet records file, as the dicts `RequestRecord.from_dict` takes."""
    pa = _arrow()
    rows = pa.parquet.read_table(str(path)).to_pylist()
    for row in rows:
        level = row.get("level")
        if isinstance(level, float) and level.is_integer():
            row["level"] = int(level)
    return rows


def write_records(path: Path | Any, records: list[RequestRecord]) -> None:
    """A whole Parquet records file at once (`loadgen export`)."""
    writer = ParquetWriter(path)
    try:
        for i in range(0, len(records), 65536):
            writer.write(records[i:i + 65536])
    finally:
        writer.close()
