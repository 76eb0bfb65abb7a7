"""One configuration model: flag > env > config file > default, one-line errors,
stepwatch config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwatch.cli import main
from stepwatch.errors import ConfigError, MissingDependencyError
from stepwatch.extras import from_import_error, hint, require
from stepwatch.settings import Settings

pytestmark = pytest.mark.unit


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "stepwatch.toml"
    path.write_text(text)
    return str(path)


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        'partitions = 3\ntopic_prefix = "file"\n[stream]\nbatch = 77\n'
        '[kafka_config]\n"client.id" = "from-file"\n',
    )
    env = {"STEPWATCH_TOPIC_PREFIX": "env"}
    s = Settings.load(env=env, config_file=cfg, partitions=5)
    assert (s.partitions, s.topic_prefix, s.stream_batch, s.log_level) == (5, "env", 77, "INFO")
    assert s.kafka_config == {"client.id": "from-file"}
    assert s.sources["partitions"] == "flag"
    assert s.sources["topic_prefix"] == "env"
    assert s.sources["stream_batch"] == "file"
    assert s.sources["log_level"] == "default"


def test_config_file_from_env_variable(tmp_path: Path) -> None:
    cfg = write(tmp_path, "[sink]\nbatch_messages = 42\n")
    assert Settings.load(env={"STEPWATCH_CONFIG": cfg}).sink_batch_messages == 42


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("partitions = 'many'\n", "setting partitions (from the config file)"),
        ("no_such_thing = 1\n", "unknown setting no_such_thing"),
        ("[stream]\nwarp = 9\n", "unknown setting [stream] warp"),
        ("partitions = \n", "not valid TOML"),
        ("stream_batch = 2.5\n", "setting stream_batch"),
    ],
)
def test_bad_config_file_is_a_config_error_naming_the_setting(
    tmp_path: Path, text: str, needle: str
) -> None:
    with pytest.raises(
        ConfigError,
        match=needle.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        Settings.load(env={}, config_file=write(tmp_path, text))


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="config file"):
        Settings.load(env={}, config_file="does/not/exist.toml")


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--log-level", "LOUD", "config"], {}, "setting log_level: 'LOUD'"),
        (
            ["config"],
            {"STEPWATCH_PARTITIONS": "abc"},
            "setting partitions (from STEPWATCH_PARTITIONS)",
        ),
        (["config"], {"STEPWATCH_METRICS_PORT": "70000"}, "setting metrics_port: port 70000"),
        (["config"], {"STEPWATCH_STREAM_FAUST_LOG_LEVEL": "chatty"}, "stream_faust_log_level"),
    ],
)
def test_cli_bad_value_is_one_line_not_a_traceback(
    argv: list[str],
    env: dict[str, str],
    needle: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1
    assert needle in err


def test_stepwatch_config_masks_secrets_and_names_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STEPWATCH_CLICKHOUSE_PASSWORD", "hunter2")
    monkeypatch.setenv("STEPWATCH_KAFKA__SASL_PASSWORD", "s3cret")
    cfg = write(tmp_path, "[stream]\ntick_seconds = 2.5\n")
    assert main(["--config", cfg, "config", "--json", "--partitions", "4"]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "s3cret" not in out
    data = json.loads(out)
    assert data["settings"]["clickhouse_password"] == "***"
    assert data["settings"]["kafka_config"]["sasl.password"] == "***"
    assert data["settings"]["partitions"] == 4
    assert data["sources"]["partitions"] == "flag"
    assert data["settings"]["stream_tick_seconds"] == 2.5
    assert data["sources"]["stream_tick_seconds"] == "file"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from stepwatch import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"stepwatch {__version__}"


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepwatch import extras

    require("json")  # stdlib: present
    monkeypatch.setitem(extras.EXTRAS, "no_such_pkg_xyz", ("no-such-pkg", "stream"))
    with pytest.raises(
        MissingDependencyError, match=r"x needs no-such-pkg: pip install 'stepwatch\[stream\]'"
    ):
        require("json", "no_such_pkg_xyz", what="x")
    assert hint("faust", "the stream worker") == (
        "the stream worker needs faust-streaming: pip install 'stepwatch[stream]'"
    )


def test_missing_optional_module_becomes_one_line_hint() -> None:
    err = ModuleNotFoundError("No module named 'confluent_kafka'", name="confluent_kafka")
    translated = from_import_error(err)
    assert translated is not None and "stepwatch[agent]" in str(translated)
    assert from_import_error(ModuleNotFoundError("x", name="not_ours")) is None


def test_require_accepts_a_module_already_imported_without_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    fake = types.ModuleType("odd_module_xyz")
    fake.__spec__ = None
    monkeypatch.setitem(__import__("sys").modules, "odd_module_xyz", fake)
    require("odd_module_xyz")  # faust's module looks like this once imported
