"""The workshop preset: one setting, the same model and sizes in every lesson on every machine."""

import json
import re

import papermill
import pytest

from helpers.lessons import COMMON, DEFAULTS, PRESET_ENV, WORKSHOP, apply_preset, preset_name, settings_for
from tests.test_notebooks import NOTEBOOKS, SOLUTIONS


def test_no_preset_leaves_every_parameter_as_it_is(monkeypatch):
    monkeypatch.delenv(PRESET_ENV, raising=False)
    assert preset_name() is None
    assert apply_preset("01", None, MODEL=None, N_TICKETS=None) == dict(MODEL=None, N_TICKETS=None)
    monkeypatch.setenv(PRESET_ENV, "")  # make exports an empty SLM_PRESET when none is set
    assert preset_name() is None


def test_the_environment_or_the_notebook_turns_it_on_and_what_you_set_wins(monkeypatch, capsys):
    monkeypatch.delenv("SLM_MODEL", raising=False)
    monkeypatch.setenv(PRESET_ENV, "workshop")
    chosen = apply_preset("02", None, MODEL=None, N_TICKETS=None)
    assert chosen == dict(MODEL="embedded", N_TICKETS=8)
    assert capsys.readouterr().out.strip() == "workshop preset: MODEL='embedded', N_TICKETS=8"
    mine = apply_preset("02", None, MODEL=None, N_TICKETS=40)
    assert mine["N_TICKETS"] == 40 and mine["MODEL"] == "embedded"
    assert "yours kept: N_TICKETS: 40" in capsys.readouterr().out
    sweep = apply_preset("04", None, MODEL=None, TICKETS_PER_POINT=None, BATCH_SIZES=None, DTYPES=None)
    assert sweep == dict(MODEL="embedded", TICKETS_PER_POINT=8, BATCH_SIZES=[1, 2, 4, 8, 16, 32], DTYPES=["float32"])
    capsys.readouterr()
    monkeypatch.setenv("SLM_MODEL", "twin:qwen2.5-0.5b")  # MODEL = None means $SLM_MODEL: the reader's choice
    assert apply_preset("02", None, MODEL=None, N_TICKETS=None)["MODEL"] is None
    assert "yours kept: MODEL: $SLM_MODEL='twin:qwen2.5-0.5b'" in capsys.readouterr().out
    monkeypatch.delenv("SLM_MODEL")
    monkeypatch.delenv(PRESET_ENV)
    chosen = apply_preset("03", "workshop", MODEL=None, N_TICKETS=None, RACE_BATCH=None, verbose=False)
    assert chosen["N_TICKETS"] == WORKSHOP["03"]["N_TICKETS"] and chosen["RACE_BATCH"] == WORKSHOP["03"]["RACE_BATCH"]


def test_bad_presets_and_forgotten_parameters_get_one_line_errors(monkeypatch):
    monkeypatch.setenv(PRESET_ENV, "conference")
    with pytest.raises(ValueError, match=r"unknown preset 'conference' in \$SLM_PRESET: choose from workshop"):
        apply_preset("01", None, MODEL=None)
    with pytest.raises(ValueError, match="unknown preset 'Workshop' in PRESET"):
        apply_preset("01", "Workshop", MODEL=None)
    with pytest.raises(ValueError, match="lesson 04 did not pass DTYPES to apply_preset"):
        apply_preset("04", "workshop", MODEL=None, TICKETS_PER_POINT=None, BATCH_SIZES=None)
    with pytest.raises(ValueError, match="has no lesson '07'"):
        apply_preset("07", "workshop", MODEL=None)


def test_a_lesson_has_every_setting_by_default_and_refuses_an_unknown_one_in_one_line(monkeypatch):
    monkeypatch.delenv(PRESET_ENV, raising=False)
    settings, line = settings_for("03", {"RACE_BATCH": 8})
    assert settings == {**COMMON, **DEFAULTS["03"], "RACE_BATCH": 8} and line is None
    with pytest.raises(ValueError, match="lesson 03 has no setting RACE_BATCHES: its settings are MODEL, PRESET"):
        settings_for("03", {"RACE_BATCHES": 8})
    settings, line = settings_for("04", {"PRESET": "workshop", "BATCH_SIZES": [1, 2]})
    assert settings["TICKETS_PER_POINT"] == 8 and settings["BATCH_SIZES"] == [1, 2]
    assert line.startswith("workshop preset: MODEL='embedded', TICKETS_PER_POINT=8") and "yours kept: BATCH_SIZES" in line


@pytest.mark.parametrize("notebook", NOTEBOOKS + SOLUTIONS, ids=lambda path: path.stem)
def test_every_notebook_takes_the_preset_for_every_parameter_it_sets(notebook):
    """A lesson opened with open_lesson takes the preset for every setting it sets (each defaults to None there);
    another notebook declares PRESET and those parameters, defaulting to None, and passes them to apply_preset."""
    key = "solutions" if notebook.parent.name == "solutions" else notebook.stem[:2]
    code = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"]
                     if cell["cell_type"] == "code")
    if f'open_lesson("{key}"' in code:
        defaults = {**COMMON, **DEFAULTS[key]}
        assert all(defaults[name] is None for name in WORKSHOP[key]), f"{key}: a preset setting must default to None"
        return
    declared = papermill.inspect_notebook(str(notebook))
    assert declared["PRESET"]["default"] == "None", f"{notebook.name}: PRESET must default to None"
    for name in WORKSHOP[key]:
        assert declared[name]["default"] == "None", \
            f"{notebook.name}: {name} must default to None for the preset to set it"
    code = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"]
                     if cell["cell_type"] == "code")
    call = re.search(rf'apply_preset\(\s*"{key}", PRESET, ([^)]*)\)', code)
    assert call, f"{notebook.name}: no apply_preset({key!r}, PRESET, ...) call"
    passed = {part.split("=")[0].strip() for part in call.group(1).split(",")}
    assert passed >= set(WORKSHOP[key]), f"{notebook.name}: apply_preset misses {set(WORKSHOP[key]) - passed}"
