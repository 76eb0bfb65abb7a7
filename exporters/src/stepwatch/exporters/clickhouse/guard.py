"""What the store endpoint lets a request run, decided with the engine's own parser.

Every request is one statement. The engine parses it (``formatQuerySingleLine``
over the text given as an escaped string literal: it refuses multi-statements
and drops comments) and the endpoint then runs the engine's canonical text,
never the text it was sent. ``EXPLAIN AST`` of that text gives the statement's
tree, which is checked against:

* the statement kinds the endpoint accepts (reads only on the read-only one);
* functions that reach the file system, the network or the host process: every
  table function the engine lists in ``system.table_functions`` is refused but
  a few that only compute (``numbers``, ``values``, ``generateRandom``, ...),
  and the ``file()`` scalar function;
* table and database engines other than the local, in-store ones, and
  dictionaries (their sources read files and hosts);
* ``INTO OUTFILE`` / ``FROM INFILE``, output formats that read schema or
  template files, and the settings that name files or hosts.

Database names, setting names and formats from the URL are checked against the
engine's lists (``system.databases``, ``system.settings``, ``system.formats``)
and values are only ever passed as escaped string literals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, NoReturn

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.sqltext import Kind, LexError, Token, tokens

SAFE_TABLE_FUNCTIONS = frozenset(
    {
        "numbers",
        "numbers_mt",
        "zeros",
        "zeros_mt",
        "values",
        "generaterandom",
        "generate_series",
        "generateseries",
        "null",
        "view",
        "format",
        "merge",
        "primes",
    }
)
DENIED_FUNCTIONS = frozenset({"file"})  # the scalar file(path) reads a file into a string
SAFE_ENGINES = frozenset(
    {
        "Memory",
        "Log",
        "TinyLog",
        "StripeLog",
        "Null",
        "Set",
        "Join",
        "Buffer",
        "Merge",
        "GenerateRandom",
        "View",
        "MaterializedView",
        "Atomic",
        "Ordinary",
    }
)
DENIED_FORMATS = frozenset(
    {
        "template",
        "templateignorespaces",
        "protobuf",
        "protobuflist",
        "protobufsingle",
        "capnproto",
        "avro",
        "avroconfluent",
        "regexp",
    }
)
DENIED_SETTINGS = frozenset(
    {
        "readonly",
        "format_schema",
        "format_schema_source",
        "output_format_schema",
        "format_template_resultset",
        "format_template_row",
        "format_template_rows_between_delimiter",
        "input_format_record_errors_file_path",
        "format_avro_schema_registry_url",
        "url_base",
        "into_outfile_create_parent_directories",
        "s3queue_default_zookeeper_path",
        "input_format_values_interpret_expressions",
        "input_format_values_deduce_templates_of_expressions",
        "allow_introspection_functions",
        "dialect",
        "allow_experimental_kusto_dialect",
        "allow_experimental_prql_dialect",
        "disk",
        "storage_policy",  # table settings: disk(type = local, path = ...) reaches any directory
    }
)
MIN_SECONDS = 0.001  # the least time limit the endpoint passes on (the engine keeps µs)
TIME_SETTINGS = frozenset({"max_execution_time"})  # seconds; every other capped one is whole
# per-query limits: from the URL only, and capped by the endpoint
CAPPED_SETTINGS = frozenset(
    {
        "max_execution_time",
        "max_result_bytes",
        "max_memory_usage",
        "max_memory_usage_for_user",
        "max_threads",  # threads one statement runs on: at most the owner's cores
        "function_sleep_max_microseconds_per_block",  # 0 (no bound) would let sleep() hold a slot
    }
)
READ_KINDS = frozenset(
    {
        "SelectWithUnionQuery",
        "SelectIntersectExceptQuery",
        "SelectQuery",
        "DescribeQuery",
        "Explain",
    }
)
READ_KIND_PREFIXES = ("Show", "Exists")
WRITE_KINDS = READ_KINDS | {
    "InsertQuery",
    "CreateQuery",
    "AlterQuery",
    "DropQuery",
    "TruncateQuery",
    "OptimizeQuery",
    "Rename",
}
DENIED_ALTER_COMMANDS = ("FETCH", "FREEZE", "UNFREEZE")
DEFAULT_MAX_QUERY_SIZE = 262144  # the engine's default max_query_size
_ENGINE_CODE = re.compile(r"Code:\s*(\d+)")
_FORMAT_TAIL = re.compile(r"\sFORMAT\s+(\w+)\s*$")


class Refused(StoreError):
    """A request the endpoint will not run; carries ClickHouse's error code and an HTTP status."""

    def __init__(
        self, message: str, code: int, status: HTTPStatus = HTTPStatus.BAD_REQUEST
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True)
class Catalog:
    """The engine's own names: settings, table functions, output formats."""

    settings: frozenset[str]
    table_functions: frozenset[str]  # lower-cased
    formats: frozenset[str]  # lower-cased, output and input
    aliases: Mapping[str, str] = field(
        default_factory=dict
    )  # setting alias -> setting, lower-cased

    def denied_setting(self, name: str) -> bool:
        """A setting (or an alias of one) that names files, hosts, the dialect or limits."""
        lower = name.lower()
        return lower in DENIED_SETTINGS or self.aliases.get(lower, "") in DENIED_SETTINGS

    @classmethod
    def load(cls, session: Any) -> Catalog:
        def names(sql: str) -> list[str]:
            lines: list[str] = session.query(sql, "TSVRaw").bytes().decode().splitlines()
            return lines

        return cls(
            settings=frozenset(names("SELECT name FROM system.settings")),
            table_functions=frozenset(
                n.lower() for n in names("SELECT name FROM system.table_functions")
            ),
            formats=frozenset(n.lower() for n in names("SELECT name FROM system.formats")),
            aliases=dict(
                line.lower().split("\t", 1)
                for line in names(
                    "SELECT name, alias_for FROM system.settings WHERE alias_for != ''"
                )
            ),
        )


@dataclass(frozen=True)
class Statement:
    """One statement as the engine parsed it."""

    text: str  # the engine's canonical single-line text: what runs
    kind: str  # the root node of its syntax tree
    ast: tuple[tuple[int, str], ...]  # (depth, node label)

    @property
    def insert_format(self) -> str | None:
        """The data format of an ``INSERT ... FORMAT x`` (None for ``INSERT ... SELECT``)."""
        match = _FORMAT_TAIL.search(self.text) if self.kind == "InsertQuery" else None
        return match.group(1) if match else None

    @property
    def insert_head(self) -> str:
        """The statement without its ``FORMAT`` clause, for a streaming insert."""
        match = _FORMAT_TAIL.search(self.text)
        return self.text[: match.start()] if match else self.text


def literal(value: str) -> str:
    """``value`` as a ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def identifier(name: str) -> str:
    """``name`` as a back-quoted ClickHouse identifier."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _engine_refusal(err: Exception) -> Refused:
    """The engine's answer to a check's statement, with its own code and status: a parse
    error is 62 (400), a limit the request set (TIMEOUT_EXCEEDED under a 1 ms
    ``max_execution_time``) keeps its code and status (159, 408)."""
    text = str(err).strip().split(": In scope SELECT formatQuerySingleLine", 1)[0]
    match = _ENGINE_CODE.search(text)
    code = int(match.group(1)) if match else 62
    return Refused(text, code, HTTPStatus(status_of(code)))


def status_of(code: int | None) -> int:
    """The HTTP status ClickHouse gives an engine error (its exceptionCodeToHTTPStatus,
    in short)."""
    if code in (
        164,
        344,
        497,
        516,
    ):  # READONLY, SUPPORT_IS_DISABLED, ACCESS_DENIED, AUTHENTICATION_FAILED
        return 403
    if code in (60, 81, 83):  # UNKNOWN_TABLE, UNKNOWN_DATABASE, UNKNOWN_DICTIONARY (as 404)
        return 404
    if code in (6, 26, 27, 38, 41, 46, 47, 53, 62, 69, 70, 72, 73, 115, 117, 396, 456, 457):
        return 400  # parse, type, unknown-name, bad-parameter and result-too-big errors
    if code == 159:  # TIMEOUT_EXCEEDED
        return 408
    return 500


class Guard:
    """Checks requests against the engine's catalog and the endpoint's mode."""

    def __init__(
        self, catalog: Catalog, *, readonly: bool, caps: Mapping[str, float] | None = None
    ) -> None:
        self.catalog = catalog
        self.readonly = readonly
        self.caps = dict(caps or {})  # per-statement limits: a SETTINGS clause may only lower

    # -------------------------------------------------------------- URL values
    def setting(self, name: str) -> str:
        if name not in self.catalog.settings:
            raise Refused(f"Unknown setting {name!r}. (UNKNOWN_SETTING)", 115)
        if self.catalog.denied_setting(name):
            raise Refused(
                f"Setting {name!r} cannot be set through this endpoint. (ACCESS_DENIED)",
                497,
                HTTPStatus.FORBIDDEN,
            )
        return name

    def output_format(self, name: str) -> str:
        if name.lower() not in self.catalog.formats:
            raise Refused(f"Unknown format {name!r}. (UNKNOWN_FORMAT)", 73)
        if name.lower() in DENIED_FORMATS:
            raise Refused(
                f"Format {name!r} reads files and is not served here. (ACCESS_DENIED)",
                497,
                HTTPStatus.FORBIDDEN,
            )
        return name

    def database(self, session: Any, name: str) -> str:
        out = session.query(
            "SELECT count() FROM system.databases WHERE name = {d:String}",
            "TSVRaw",
            params={"d": name},
        )
        if out.bytes().strip() != b"1":
            raise Refused(
                f"Database {name!r} does not exist. (UNKNOWN_DATABASE)", 81, HTTPStatus.NOT_FOUND
            )
        return name

    # -------------------------------------------------------------- statements
    def statement(
        self,
        session: Any,
        sql: str,
        params: dict[str, str] | None = None,
        max_size: int = DEFAULT_MAX_QUERY_SIZE,
    ) -> Statement:
        """The one statement in ``sql``, parsed by the engine and checked; Refused otherwise.
        A statement over ``max_size`` bytes (the engine's ``max_query_size``) is refused
        before any parse: the checks' wrapper would otherwise lift that limit for it."""
        size = len(sql.encode())
        if size > max_size:
            raise Refused(
                f"Max query size exceeded: {size} bytes, max_query_size is {max_size}."
                " (SYNTAX_ERROR)",
                62,
            )
        wrapped = f"SELECT formatQuerySingleLine({literal(sql)})"
        if (
            len(wrapped) > DEFAULT_MAX_QUERY_SIZE // 2
        ):  # the wrapper must not trip the parser's limit
            session.query(f"SET max_query_size = {2 * len(wrapped.encode()) + 4096}")
        try:
            out = session.query(wrapped, "TSVRaw")
        except Exception as err:
            raise _engine_refusal(err) from err
        text = out.bytes().decode().rstrip("\n")
        if "\n" in text:
            raise Refused("Multi-line canonical text. (SYNTAX_ERROR)", 62)
        try:
            explained = session.query(f"EXPLAIN AST {text}", "TSVRaw", params=params or None)
        except Exception as err:
            raise _engine_refusal(err) from err
        ast = tuple(
            (len(line) - len(line.lstrip(" ")), line.strip())
            for line in explained.bytes().decode().splitlines()
            if line.strip()
        )
        if not ast:
            raise Refused("Empty query. (SYNTAX_ERROR)", 62)
        stmt = Statement(text=text, kind=ast[0][1].split(" ", 1)[0], ast=ast)
        self._check_kind(stmt)
        self._check_tree(stmt)
        self._check_words(stmt)
        return stmt

    def _check_kind(self, stmt: Statement) -> None:
        kinds = READ_KINDS if self.readonly else WRITE_KINDS
        allowed = stmt.kind in kinds or stmt.kind.startswith(READ_KIND_PREFIXES)
        if stmt.kind == "Explain":
            inner = [label.split(" ", 1)[0] for depth, label in stmt.ast if depth == 1]
            allowed = all(k in READ_KINDS or k in ("Set", "Identifier") for k in inner)
        if allowed:
            return
        if self.readonly:
            raise Refused(
                f"Cannot execute query in readonly mode: {stmt.kind} is refused by the read-only "
                "store endpoint. (READONLY)",
                164,
                HTTPStatus.FORBIDDEN,
            )
        _deny(f"{stmt.kind}")

    def _check_tree(self, stmt: Statement) -> None:
        for index, (depth, label) in enumerate(stmt.ast):
            head, *words = label.split()
            name = words[0] if words else ""
            if head in ("Function", "FunctionWithKeyValueArguments"):
                self._check_function(name)
            elif label.startswith("Dictionary definition"):
                _deny("dictionaries (their sources read files and hosts)")
            elif label.startswith("Storage definition"):
                self._check_engine(stmt.ast, index, depth)
            elif head == "AlterCommand" and name.startswith(DENIED_ALTER_COMMANDS):
                _deny(f"ALTER {name}")
            elif (
                depth == 1
                and head == "Literal"
                and stmt.kind in ("SelectWithUnionQuery", "InsertQuery")
            ):
                _deny("INTO OUTFILE / FROM INFILE")

    def _check_function(self, name: str) -> None:
        lower = name.lower()
        if lower in DENIED_FUNCTIONS:
            _deny(f"function {name}() (it reads files)")
        if lower in self.catalog.table_functions and lower not in SAFE_TABLE_FUNCTIONS:
            _deny(f"table function {name}() (it reaches files, hosts or the process)")

    @staticmethod
    def _check_engine(ast: tuple[tuple[int, str], ...], index: int, depth: int) -> None:
        for child_depth, label in ast[index + 1 :]:
            if child_depth <= depth:
                return
            head, *words = label.split()
            if child_depth == depth + 1 and head == "Function":
                engine = words[0] if words else ""
                if not (
                    engine in SAFE_ENGINES or engine.endswith("MergeTree")
                ) or engine.startswith("Replicated"):
                    _deny(f"engine {engine} (only local, in-store engines are served)")
                return

    def _check_words(self, stmt: Statement) -> None:
        try:
            toks = list(tokens(stmt.text))
        except LexError as err:
            raise Refused(f"Cannot read the canonical query: {err}. (SYNTAX_ERROR)", 62) from err
        for i, tok in enumerate(toks):
            if tok.word in ("OUTFILE", "INFILE"):
                _deny(f"{tok.word} (the endpoint never reads or writes local files)")
            if tok.word in ("SETTINGS", "SETTING"):  # SETTING: ALTER TABLE ... MODIFY SETTING
                for name, value in _settings_clause(toks, i + 1):
                    if self.catalog.denied_setting(name):
                        _deny(f"setting {name}")
                    if name.lower() in CAPPED_SETTINGS and not self._lowers(name, value):
                        _deny(
                            f"setting {name} in the query above the endpoint's limit "
                            "(or not a plain number)"
                        )
            if tok.word == "FORMAT" and _is_format_clause(toks, i):
                self.output_format(toks[i + 1].text)

    def _lowers(self, name: str, value: list[Token]) -> bool:
        """A capped setting set in the query to one plain number within the cap that the
        engine cannot read as 0 (no limit to it): a whole number from 1 for a whole setting
        (0.5 threads is 0), from :data:`MIN_SECONDS` for a time (1e-9 s is 0 µs). Anything
        else (an expression, a parameter) is refused."""
        cap = self.caps.get(name.lower())
        if cap is None or len(value) != 1 or value[0].kind is not Kind.NUMBER:
            return False
        try:
            asked = float(value[0].text)
        except ValueError:
            return False
        if name.lower() in TIME_SETTINGS:
            return MIN_SECONDS <= asked <= cap
        return asked.is_integer() and 1 <= asked <= cap


def _settings_clause(toks: list[Token], i: int) -> list[tuple[str, list[Token]]]:
    """The (name, value tokens) of a ``SETTINGS name = value, ...`` clause starting at
    ``toks[i]``."""
    names: list[tuple[str, list[Token]]] = []
    while (
        i + 1 < len(toks) and toks[i].kind in (Kind.WORD, Kind.QUOTED) and toks[i + 1].text == "="
    ):
        value: list[Token] = []
        names.append((toks[i].name, value))
        depth, i = 0, i + 2
        while i < len(toks):
            tok = toks[i]
            if tok.kind is Kind.PUNCT and tok.text in "([":
                depth += 1
            elif tok.kind is Kind.PUNCT and tok.text in ")]":
                if depth == 0:
                    return names
                depth -= 1
            elif depth == 0 and (tok.text == "," or tok.word == "FORMAT"):
                break
            value.append(tok)
            i += 1
        if i >= len(toks) or toks[i].text != ",":
            return names
        i += 1
    return names


def _is_format_clause(toks: list[Token], i: int) -> bool:
    """``FORMAT name`` that ends the statement (or comes before its SETTINGS)."""
    if i + 1 >= len(toks) or toks[i + 1].kind is not Kind.WORD:
        return False
    return i + 2 == len(toks) or toks[i + 2].word == "SETTINGS"


def _deny(what: str) -> NoReturn:
    raise Refused(
        f"{what} is refused by the store endpoint. (ACCESS_DENIED)", 497, HTTPStatus.FORBIDDEN
    )
