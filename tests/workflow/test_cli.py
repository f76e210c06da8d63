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
    with pytest.raises(SystemExit) as exc:  # argparse: the scale is one of the presets
        cli.main(["config", "--scale", "huge"])
    assert exc.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
