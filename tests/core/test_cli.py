"""The `hybridlab` command's subcommands on valid input (exit 0) and on bad input (one line, exit 1)."""

import pytest

from hybridlab import cli


def test_languages_lists_every_registry_language_with_each_datasets_name(capsys):
    assert cli.main(["languages"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["code", "name", "flores_plus", "flores200", "fineweb2", "ntrex128"]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert rows["zho_Hans"][2:] == ["cmn_Hans", "zho_Hans", "cmn_Hani", "zho_Hans"]
    assert rows["ory_Orya"][-1] == "-"  # NTREX-128 has no Odia


def test_config_validates_the_real_preset_and_refuses_an_unknown_one(capsys):
    assert cli.main(["config", "--scale", "real"]) == 0
    assert '"gguf"' in capsys.readouterr().out


def _one_line_error(capsys, argv, starts: str) -> str:
    """`hybridlab ARGV` exits 1 with one line on stderr that starts with `starts`."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's errors leave through exit()
        code = exc.code
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {starts}"), err
    return err


@pytest.mark.parametrize("argv, starts", [
    ([], "the following arguments are required: COMMAND"),
    (["config", "--scale", "huge"], "argument --scale: invalid choice: 'huge'"),
    (["config", "--configfile", "/nonexistent/config.yaml"], "config: /nonexistent/config.yaml not found"),
    (["placements", "--scheme", "sideways", "--layers", "12"], "unknown placement scheme 'sideways'"),
    (["placements", "--scheme", "sandwich", "--layers", "twelve"], "argument --layers: invalid int value"),
    (["placements", "--scheme", "sandwich", "--layers", "12", "--ratio", "2"], "FA ratio 2.0 is outside (0, 1]"),
    (["languages", "--all"], "unrecognized arguments: --all"),
    (["cache"], "the following arguments are required: SUBCOMMAND"),
    (["plan", "--gpus", "four"], "argument --gpus: 'four' is not an integer"),
])
def test_bad_input_is_one_line_and_exit_code_1(capsys, argv, starts):
    err = _one_line_error(capsys, argv, starts)
    if argv[:1] in (["config"], ["placements"]) and "argument" in starts:
        assert f"see `hybridlab {argv[0]} --help`" in err


def test_cache_pull_outside_a_repository_is_one_line(capsys, tmp_path):
    _one_line_error(capsys, ["cache", "pull", "--repo", str(tmp_path)], f"{tmp_path} has no dvc.yaml/.dvc")


def test_placements_prints_the_layers_and_the_diagram(capsys):
    assert cli.main(["placements", "--scheme", "sandwich", "--layers", "12", "--ratio", "0.25"]) == 0
    assert capsys.readouterr().out.splitlines() == ["sandwich: FA layers [0, 1, 11]", "AA.........A"]


@pytest.mark.parametrize("scale", ["tiny", "real"])
def test_plan_runs_at_the_cpu_presets(capsys, scale):
    """The plan traces the CPU mixers on meta tensors (no values) and skips the studies a preset leaves out."""
    assert cli.main(["plan", "--scale", scale]) == 0
    out = capsys.readouterr().out
    assert "distill_stage2" in out
    assert ("bld_sr (every arm)" in out) == (scale == "tiny")
